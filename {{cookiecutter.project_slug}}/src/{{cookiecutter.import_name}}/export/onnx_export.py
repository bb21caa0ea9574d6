"""Checkpoint → ONNX file with a dynamic batch, checked with onnx.checker and onnxruntime.

The graph takes what a deployment has: uint8 RGB images, NCHW, shape (batch, 3, 32, 32),
pixel values 0-255; normalization is inside. It returns logits of shape (batch, classes).
The file is written under a temporary name beside the output and renamed only once the
export and its checks succeeded, so a failed export never leaves a partial ``.onnx``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..checkpointing import CheckpointError, read_checkpoint
from ..errors import parse_error_line
from ..models import ImageClassifier

INPUT_NAME, OUTPUT_NAME = "images", "logits"
MAX_BATCH = 4096


class ExportError(RuntimeError):
    """The export cannot proceed; the message says what is wrong and how to fix it."""


@dataclass(frozen=True)
class Parity:
    """How closely onnxruntime reproduces PyTorch, per tested batch size."""

    batch_sizes: tuple[int, ...]
    max_abs_diff: float
    argmax_equal: bool
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= self.tolerance and self.argmax_equal


def load_model(ckpt_path: Path) -> tuple[ImageClassifier, dict]:
    """The model rebuilt from the checkpoint's hyperparameters, in eval mode, and the raw checkpoint."""
    if not ckpt_path.is_file():
        raise ExportError(f"checkpoint {ckpt_path} does not exist; pass the path of a .ckpt file with --ckpt_path")
    try:
        checkpoint = read_checkpoint(ckpt_path)
    except CheckpointError as error:
        raise ExportError(str(error)) from error
    try:
        model = ImageClassifier.load_from_checkpoint(ckpt_path, map_location="cpu")
    except Exception as error:  # a checkpoint of another model fails in many ways
        # One line; e.g. "model.backbone: No module named 'my_nets'" for a network that is not importable here.
        reason = parse_error_line(str(error)).replace("module.", "model.", 1)
        raise ExportError(f"{ckpt_path} does not rebuild an ImageClassifier: {reason}") from error
    return model.eval(), checkpoint


def sample_images(batch: int, seed: int = 0) -> torch.Tensor:
    """Deterministic, natural-looking uint8 images: smooth colour fields plus a little noise."""
    generator = torch.Generator().manual_seed(seed)
    coarse = torch.rand(batch, 3, 4, 4, generator=generator) * 255
    smooth = torch.nn.functional.interpolate(coarse, size=(32, 32), mode="bilinear", align_corners=False)
    noise = torch.randn(batch, 3, 32, 32, generator=generator) * 8
    return (smooth + noise).clamp(0, 255).to(torch.uint8)


def export_onnx(model: ImageClassifier, output: Path, opset: int | None = None) -> None:
    """Export to ``output`` (one self-contained file), via a temporary file in the same folder."""
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ExportError(f"cannot write to {output.parent} ({error.strerror}); choose another --output") from error
    if not os.access(output.parent, os.W_OK):
        raise ExportError(f"cannot write to {output.parent} (permission denied); choose another --output")
    partial = output.with_name(f".{output.name}.partial-{os.getpid()}")
    try:
        torch.onnx.export(
            model,
            (sample_images(2),),
            str(partial),
            dynamo=True,
            external_data=False,
            verbose=False,
            opset_version=opset,
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_shapes={"images": {0: torch.export.Dim("batch", min=1, max=MAX_BATCH)}},
        )
        check(partial)
        os.replace(partial, output)
    except ExportError:
        raise
    except Exception as error:
        raise ExportError(f"ONNX export failed ({type(error).__name__}: {error})") from error
    finally:
        partial.unlink(missing_ok=True)
        Path(f"{partial}.data").unlink(missing_ok=True)


def check(path: Path) -> None:
    import onnx

    onnx.checker.check_model(onnx.load(str(path)), full_check=True)


def verify(
    model: ImageClassifier, path: Path, batch_sizes: tuple[int, ...] = (1, 7), tolerance: float = 1e-4
) -> Parity:
    """Compare onnxruntime (CPU) against PyTorch on the same images, at each batch size."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst, same_argmax = 0.0, True
    for index, batch in enumerate(batch_sizes):
        images = sample_images(batch, seed=index)
        with torch.no_grad():
            expected = model(images).numpy()
        (actual,) = session.run([OUTPUT_NAME], {INPUT_NAME: images.numpy()})
        worst = max(worst, float(np.abs(actual - expected).max()))
        same_argmax &= bool((actual.argmax(axis=1) == expected.argmax(axis=1)).all())
    return Parity(tuple(batch_sizes), worst, same_argmax, tolerance)
