"""A model card beside the exported file: what goes in, what comes out, what it cost, where it came from."""

from __future__ import annotations

import json
from pathlib import Path

from ..model_cost import ModelCost
from ..models import ImageClassifier
from .onnx_export import INPUT_NAME, OUTPUT_NAME, Parity


def backbone_settings(model: ImageClassifier, checkpoint: dict) -> dict:
    """The backbone as the run's config gave it (class_path and init_args), or its class when built in Python."""
    given = checkpoint.get("hyper_parameters", {}).get("backbone")
    if isinstance(given, dict):
        return given
    network = type(model.backbone)
    return {"class_path": f"{network.__module__}.{network.__qualname__}"}


def build_card(
    model: ImageClassifier, checkpoint: dict, ckpt_path: Path, onnx_path: Path, cost: ModelCost, parity: Parity
) -> dict:
    hparams = model.hparams
    return {
        "model": {"file": onnx_path.name, "format": "onnx", "backbone": backbone_settings(model, checkpoint)},
        "input": {
            "name": INPUT_NAME,
            "dtype": "uint8",
            "shape": ["batch", 3, 32, 32],
            "layout": "NCHW, RGB channels, pixel values 0-255",
            "normalization": "inside the graph: (pixels / 255 - mean) / std",
            "mean": list(hparams.mean),
            "std": list(hparams.std),
        },
        "output": {
            "name": OUTPUT_NAME,
            "dtype": "float32",
            "shape": ["batch", hparams.num_classes],
            "meaning": "logits",
        },
        "class_names": list(model.class_names),
        "cost": cost.as_dict(),
        "source": {
            "checkpoint": str(ckpt_path),
            "epoch": checkpoint.get("epoch"),
            "global_step": checkpoint.get("global_step"),
            "config_hash": checkpoint.get("config_hash"),
        },
        "parity": {
            "runtime": "onnxruntime CPUExecutionProvider",
            "batch_sizes": list(parity.batch_sizes),
            "max_abs_logit_diff": parity.max_abs_diff,
            "tolerance": parity.tolerance,
            "argmax_equal": parity.argmax_equal,
        },
    }


def network_line(backbone: dict) -> str:
    settings = ", ".join(f"{key}={value}" for key, value in backbone.get("init_args", {}).items())
    return f"{backbone['class_path'].rpartition('.')[2]}({settings})"


def markdown(card: dict) -> str:
    cost, source, parity = card["cost"], card["source"], card["parity"]
    names = ", ".join(card["class_names"][:20]) + (" ..." if len(card["class_names"]) > 20 else "")
    return "\n".join(
        [
            f"# Model card: {card['model']['file']}",
            "",
            f"- Network: {network_line(card['model']['backbone'])}",
            f"- Input `{card['input']['name']}`: uint8 {card['input']['shape']}, {card['input']['layout']}; "
            f"{card['input']['normalization']}, mean {card['input']['mean']}, std {card['input']['std']}",
            f"- Output `{card['output']['name']}`: float32 {card['output']['shape']} logits",
            f"- Classes ({len(card['class_names'])}): {names}",
            f"- Parameters: {cost['params']:,}; MACs per image: {cost['macs_per_image']:,}; "
            f"FLOPs per image: {cost['flops_per_image']:,}",
            f"- From: {source['checkpoint']} (epoch {source['epoch']}, step {source['global_step']}, "
            f"config hash {source['config_hash']})",
            f"- onnxruntime parity at batch sizes {parity['batch_sizes']}: max |logit diff| "
            f"{parity['max_abs_logit_diff']:.2e} (tolerance {parity['tolerance']:.0e}), "
            f"argmax equal: {parity['argmax_equal']}",
            "",
        ]
    )


def write_card(card: dict, onnx_path: Path) -> tuple[Path, Path]:
    json_path, md_path = onnx_path.with_suffix(".card.json"), onnx_path.with_suffix(".card.md")
    json_path.write_text(json.dumps(card, indent=2) + "\n")
    md_path.write_text(markdown(card))
    return json_path, md_path
