"""The model card beside the exported files: what goes in and out, what each artifact scores, where it came from."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ..callbacks.linear_probe import ProbeChoice
from ..cli.model_guarantees import AVERAGED_BY_KEY
from ..contract import ClassifierModel
from ..data.preprocessing import Preprocessing
from ..foundation.files import sha256
from ..foundation.plain_values import NAME
from ..models.calibration import CHECKPOINT_KEY
from ..models.cost import ModelCost
from .contract import INPUT_NAME, ONE_VIEW, OUTPUT_NAME, SCORE_NAME, views_of
from .evaluation import describe_parity

CARD_JSON, CARD_MARKDOWN = "model.card.json", "model.card.md"
CROSS_VALIDATION_KEY = "cross_validation"  # a checkpoint's cross-validated figures (a final model's: final_model.py)
ENSEMBLE_KEY = "ensemble_of"  # a fold ensemble's members: each checkpoint and its SHA-256 (fold_ensemble.py)
# An absolute path in a string: POSIX (/a/b...) or Windows (C:\\a\\b...), at least one folder deep.
ABSOLUTE_PATH = re.compile(
    r"(?<![\w.:/])/(?:[^\s/'\"(),;|]+/)+[^\s/'\"(),;|]*|\b[A-Za-z]:\\(?:[^\s\\'\"]+\\)*[^\s\\'\"]*"
)


def machine_free(value: Any) -> Any:
    """``value`` with every absolute path replaced by its last part: a card is shipped, the machine's folders are not.

    (A file the card must pin is given by its digest as well: the checkpoint's SHA-256.)
    """
    if isinstance(value, dict):
        return {key: machine_free(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [machine_free(item) for item in value]
    if isinstance(value, str):
        return ABSOLUTE_PATH.sub(lambda found: Path(found.group(0).rstrip("/\\").replace("\\", "/")).name, value)
    return value


def run_relative(ckpt_path: Path) -> str:
    """The checkpoint as its run names it (``checkpoints/last.ckpt``), or its file name when it lies in no run."""
    if ckpt_path.parent.name == "checkpoints":
        return f"checkpoints/{ckpt_path.name}"
    return ckpt_path.name


def checkpoint_digest(source: dict) -> str:
    """The checkpoint's SHA-256 for the card's text (cards of 1.2 and before have none)."""
    return f", SHA-256 {source['checkpoint_sha256']}" if source.get("checkpoint_sha256") else ""


def source_line(source: dict) -> str:
    """Where the card's model came from: one checkpoint of its run, or the fold models of an ensemble."""
    members = source.get("ensemble_of")
    if members:
        listed = "; ".join(f"{member['checkpoint']} (SHA-256 {member['sha256']})" for member in members)
        return f"- From: the mean of {len(members)} fold models, one forward pass each: {listed}"
    return (
        f"- From: {source['checkpoint']} of its run (epoch {source['epoch']}, step {source['global_step']}, "
        f"config hash {source['config_hash']}{checkpoint_digest(source)})"
    )


def probe_choice(checkpoint: dict) -> tuple[str, str] | None:
    """What a ``LinearProbe`` decided at the final validation: (kept, in words), or None where none decided."""
    choice = ProbeChoice.of(checkpoint)
    if choice is None:
        return None
    probe, fine_tune = choice.probe_top1, choice.fine_tune_top1
    if choice.kept == "probe" and fine_tune != fine_tune:  # NaN: the probe alone (fit --recipe probe)
        return "probe", "the linear probe alone (fit --recipe probe), without a fine-tune"
    if choice.kept == "probe":
        return "probe", f"its linear probe, kept: validation top-1 {probe:.3f} against the fine-tune's {fine_tune:.3f}"
    return "fine-tune", f"kept over its linear probe: validation top-1 {fine_tune:.3f} against the probe's {probe:.3f}"


def shipped_weights(checkpoint: dict) -> str:
    """Which weights the checkpoint's state_dict holds: a weight average's (EMAWeights) or the training weights;
    and, where a linear probe ran, which of probe and fine-tune they are."""
    choice = probe_choice(checkpoint)
    if choice is not None and choice[0] == "probe":
        return f"the starting network with a head fitted on its frozen features: {choice[1]}"
    weights = averaged_or_trained(checkpoint)
    return f"{weights}; {choice[1]}" if choice is not None else weights


def averaged_or_trained(checkpoint: dict) -> str:
    if "current_model_state" not in checkpoint:
        return "the training weights at that step"
    averager = checkpoint.get(AVERAGED_BY_KEY)  # written by the run (model_guarantees): a name, or nothing
    updates = checkpoint.get("averaging_state", {}).get("n_averaged")
    count = f" over {int(updates):,} updates" if updates is not None else ""
    source = f" ({averager})" if isinstance(averager, str) and NAME.fullmatch(averager) else ""
    return f"the moving average of the training weights{count}{source}, not the last training weights"


def backbone_settings(model: ClassifierModel, checkpoint: dict) -> dict:
    """The backbone as the run's config gave it (class_path and init_args), or its class when built in Python."""
    given = checkpoint.get("hyper_parameters", {}).get("backbone")
    if isinstance(given, dict):
        return given
    network = type(model.backbone)
    return {"class_path": f"{network.__module__}.{network.__qualname__}"}


def build_card(
    model: ClassifierModel,
    checkpoint: dict,
    ckpt_path: Path,
    cost: ModelCost,
    artifacts: dict[str, dict],
    eager: dict | None,
    evaluation: dict,
    int8: dict | None,
) -> dict:
    """``artifacts``: per format, its file, runtime, size, parity and accuracy; ``eager``: PyTorch's accuracy."""
    # The record the checkpoint keeps (or, for one written without it, the same from the model's own settings).
    record = Preprocessing.of_checkpoint(checkpoint) or Preprocessing(
        model.image_size, "crop", "bilinear", 1.0, model.normalize.mean, model.normalize.std
    )
    inside = views_of(model)  # the run's test-time views, averaged inside the files as predict averages them
    tta = type(model.test_time_augmentation).__name__
    run_tta = None if tta == ONE_VIEW or inside else tta  # a network() the views could not enter: say so
    calibration = calibration_record(checkpoint)
    task = calibration["task"] if calibration else "multiclass"
    return machine_free(
        {
            "task": task,
            "network": backbone_settings(model, checkpoint),
            "test_time_augmentation": inside,
            "input": {
                "name": INPUT_NAME,
                "dtype": "uint8",
                "shape": ["batch", 3, record.image_size, record.image_size],
                "layout": "NCHW, RGB channels, pixel values 0-255",
                "resize": record.resize_rule(),
                "normalization": "inside the graph: (pixels / 255 - mean) / std",
                "mean": list(record.mean),
                "std": list(record.std),
                "preprocessing": record.as_dict(),
            },
            "output": {
                "name": OUTPUT_NAME,
                "dtype": "float32",
                "shape": ["batch", len(model.class_names)],
                "meaning": output_meaning(task, calibration),
            },
            "score_output": score_output(calibration),
            "calibration": calibration,
            "class_names": list(model.class_names),
            "cost": cost.as_dict(),
            "source": {
                "checkpoint": run_relative(ckpt_path),
                "checkpoint_sha256": sha256(ckpt_path),
                "epoch": checkpoint.get("epoch"),
                "global_step": checkpoint.get("global_step"),
                "config_hash": checkpoint.get("config_hash"),
                "weights": shipped_weights(checkpoint),
                "ensemble_of": checkpoint.get(ENSEMBLE_KEY),
            },
            "evaluation": {**evaluation, "views": inside, "test_time_augmentation_of_the_run": run_tta},
            "cross_validation": checkpoint.get(CROSS_VALIDATION_KEY),  # a final model's folds' figures
            "eager": eager,
            "artifacts": artifacts,
            "int8": int8,
        }
    )


def calibration_record(checkpoint: dict) -> dict | None:
    """What the checkpoint's calibration says, for the card's readers (None for a checkpoint written before 1.2)."""
    record = checkpoint.get(CHECKPOINT_KEY)
    if not record:
        return None
    card = {"task": record["task"], "temperature": record["temperature"], "fitted_on": record.get("fitted_on")}
    if record.get("members_temperature"):  # a fold ensemble: each member's own
        card["members_temperature"] = record["members_temperature"]
    if record.get("thresholds") is not None:
        card["thresholds"] = record["thresholds"]
        card["how"] = (
            "probability of each class = sigmoid(output); the label is given where it is >= the class's threshold"
        )
    else:
        card["how"] = "class probabilities = softmax(output)"
    fitted = record.get("fitted_on") or {}
    domain, rejection = record.get("domain"), record.get("rejection")
    unknown: dict = {}
    if domain and domain.get("score") in (domain.get("thresholds") or {}):
        unknown["unlike_training"] = {
            "score": domain["score"],
            "threshold": domain["threshold"],
            "keep_in_domain": domain["keep_in_domain"],
            "rule": f"answer 'unknown' where output 'score' < {domain['threshold']:.6g}",
            "how": SCORE_MEANINGS[domain["score"]].format(k=domain.get("neighbours"), n=domain.get("bank_images")),
            "in_domain_on_validation": fitted.get("in_domain"),
        }
    if rejection:
        probability = "max(softmax(logits))"
        unknown["likely_mistake"] = {
            **rejection,
            "rule": f"answer 'unknown' where {probability} < {rejection['threshold']:.6g}",
        }
    if unknown:
        unknown |= {
            "coverage_on_validation": fitted.get("coverage", fitted.get("in_domain")),
            "answered_accuracy_on_validation": fitted.get("answered_accuracy"),
        }
        card["unknown"] = unknown
    if "labels_given" in fitted:
        card["labels_per_image_on_validation"] = {"given": fitted["labels_given"], "true": fitted["labels_true"]}
    return card


# What the second output, ``score``, is (higher: more like the training images).
SCORE_MEANINGS = {
    "knn": "minus the distance from the L2-normalized penultimate features to the k-th nearest (k = {k}) of {n} "
    "training images' (Sun et al., ICML 2022)",
    "energy": "the negative energy of the logits: T x logsumexp(logits) (one label; Liu et al., NeurIPS 2020), "
    "sum(log(1 + exp(logits))) (several; Wang et al., NeurIPS 2021)",
    "msp": "the top probability: max(softmax(logits)) (several labels: max(sigmoid(logits)))",
    "fold_margin": "the mean over the {k} fold models of each one's own score minus its own threshold",
}


def score_output(calibration: dict | None) -> dict | None:
    """The files' second output, where the model has an "unknown" score for images unlike the training ones."""
    rule = ((calibration or {}).get("unknown") or {}).get("unlike_training")
    if rule is None:
        return None
    meaning = f"{rule['how']}; higher is more like the training images; {rule['rule']}"
    return {"name": SCORE_NAME, "dtype": "float32", "shape": ["batch"], "meaning": meaning}


def output_meaning(task: str, calibration: dict | None) -> str:
    if calibration is None:
        return "logits"
    temperature = calibration["temperature"]
    shown = f"temperature {temperature[0]:.4g}" if len(temperature) == 1 else "temperatures, one per class"
    then = (
        "sigmoid gives each class's calibrated probability"
        if task == "multilabel"
        else ("softmax gives calibrated class probabilities")
    )
    members = calibration.get("members_temperature")
    if members:  # a fold ensemble
        each = "one per class each" if any(len(t) > 1 for t in members) else ", ".join(f"{t[0]:.4g}" for t in members)
        return (
            f"calibrated logits of the mean of {len(members)} fold models' probabilities, each model's logits "
            f"divided by its own fitted temperature ({each}); {then}"
        )
    return f"calibrated logits: the network's logits divided by the fitted {shown} (calibration.temperature); {then}"


def percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{100 * fraction:.2f} %"


def measures(card: dict) -> tuple[tuple[str, str], tuple[str, str]]:
    """The table's two figures: (key, heading) of top-1 and top-5, or of mAP and micro-F1 for multi-label."""
    if card.get("task") == "multilabel":
        return ("mAP", "mAP"), ("f1_micro", "F1 (micro, at the thresholds)")
    return ("top1", "top-1"), ("top5", "top-5")


def accuracy_rows(card: dict) -> list[tuple[str, str, str, str, str]]:
    """(artifact, runtime, top-1, top-5, size) per row (multi-label: mAP, F1): eager first, then each file."""
    (first, _), (second, _) = measures(card)
    eager = card["eager"] or {}
    rows = [("PyTorch eager", "torch", percent(eager.get(first)), percent(eager.get(second)), "-")]
    for artifact in card["artifacts"].values():
        accuracy = artifact.get("accuracy") or {}
        size = f"{artifact['bytes'] / 2**20:.2f} MB"
        rows.append(
            (artifact["file"], artifact["runtime"], percent(accuracy.get(first)), percent(accuracy.get(second)), size)
        )
    return rows


def table(card: dict) -> str:
    """The accuracy table, in Markdown (the card and the command's closing output alike)."""
    (_, first), (_, second) = measures(card)
    lines = [f"| artifact | runtime | {first} | {second} | size |", "| --- | --- | --- | --- | --- |"]
    lines += ["| " + " | ".join(row) + " |" for row in accuracy_rows(card)]
    return "\n".join(lines)


def network_line(backbone: dict) -> str:
    settings = ", ".join(f"{key}={value}" for key, value in backbone.get("init_args", {}).items())
    return f"{backbone['class_path'].rpartition('.')[2]}({settings})"


def evaluation_line(evaluation: dict) -> str:
    if evaluation.get("skipped"):
        return f"- Accuracy: not measured ({evaluation['skipped']})"
    run_tta = evaluation.get("test_time_augmentation_of_the_run")
    tta = f" (the run's own evaluation averages {run_tta} views; these files compute one)" if run_tta else ""
    inside = evaluation.get("views")
    views = f"each image's {inside} views averaged inside the files" if inside else f"one view per image{tta}"
    return (
        f"- Accuracy on the {evaluation['dataset']} {evaluation['split']} split: {evaluation['images']:,} of "
        f"{evaluation['split_images']:,} images from {evaluation['data_dir']}, {views}"
    )


def int8_change(drop_points: float) -> str:
    """'loses 1.17 points' / 'gains 0.39 points' / 'loses nothing': the int8 model's top-1 against fp32, in words."""
    if drop_points == 0:
        return "loses nothing"
    return f"{'loses' if drop_points > 0 else 'gains'} {abs(drop_points):.2f} points"


def int8_loss(int8: dict) -> tuple[str, float, str]:
    """(what it is measured in, points lost, agreement in words) of a card's int8 record."""
    if "mAP_drop_points" in int8:
        return "mAP", int8["mAP_drop_points"], f"the same answer on {percent(int8['label_agreement'])} of image labels"
    return "top-1", int8["top1_drop_points"], f"the same top-1 class on {percent(int8['top1_agreement'])} of the images"


def int8_lines(int8: dict | None) -> list[str]:
    if not int8:
        return []
    calibration = int8["calibration"]
    measure, drop, agreement = int8_loss(int8)
    return [
        f"- int8 {int8_change(drop)} of {measure} against fp32 ONNX (allowed loss: "
        f"{int8['max_drop_points']} points), {agreement}",
        f"- int8 calibration: {calibration['images']} {calibration['source']} images, {calibration['method']}; "
        f"{calibration['quant_format']}, activations {calibration['activations']}, weights {calibration['weights']}",
    ]


def calibration_lines(calibration: dict | None) -> list[str]:
    if not calibration:
        return ["- Calibration: none recorded (a checkpoint of a release before 1.2); the output is raw logits"]
    fitted = calibration.get("fitted_on") or {}
    # A cross-validation's final model is calibrated on its folds' answers to the images each held out.
    on = "validation" if fitted.get("split", "val") == "val" else "the folds' out-of-fold answers"
    lines = [f"- Probabilities: {calibration['how']}; temperature scaling fitted on {on}"]
    if "ece_before" in fitted:
        lines.append(
            f"- Calibration error (ECE) on {on}: {fitted['ece_before']:.4f} before, {fitted['ece_after']:.4f} after"
        )
    if calibration.get("thresholds") is not None:
        lines.append(
            "- Thresholds (sigmoid(output) >= t gives the label): "
            + ", ".join(f"{t:.4f}" for t in calibration["thresholds"])
        )
    unknown = calibration.get("unknown") or {}
    if "unlike_training" in unknown:
        rule = unknown["unlike_training"]
        kept = f" (keeps {percent(rule['keep_in_domain'])} of all images, on {on})"
        if rule["score"] == "fold_margin":  # each fold model's threshold keeps that share of its own fold
            kept = f" (each keeps {percent(rule['keep_in_domain'])} of its fold's images)"
        lines.append(f"- Unknown, unlike the training images: {rule['rule']}; score = {rule['how']}{kept}")
    if "likely_mistake" in unknown:
        rule = unknown["likely_mistake"]
        lines.append(
            f"- Unknown, a likely mistake: {rule['rule']} (keeps {percent(rule['keep_correct'])} of the "
            f"correct answers, on {on})"
        )
    if unknown.get("coverage_on_validation") is not None:
        lines.append(f"- On {on} the model answers {percent(unknown['coverage_on_validation'])} of the images")
    counts = calibration.get("labels_per_image_on_validation")
    if counts:
        lines.append(f"- Labels per image on {on}: {counts['given']:.1f} given, {counts['true']:.1f} true")
    return lines


# The figures a cross-validation's final model cites, in the order read (the rest are in its cv_summary.csv).
CITED = {
    "top1": "top-1",
    "mAP": "mAP",
    "macro_f1": "macro-F1",
    "balanced_accuracy": "balanced accuracy",
    "micro_f1": "micro-F1",
    "ece": "ECE",
}


def cross_validation_lines(record: dict | None) -> list[str]:
    """A final model's line: what its recipe scored on images it had not seen, fold by fold, with the interval."""
    if not record:
        return []
    figures = record["figures"]
    cited = []
    for name, words in CITED.items():
        figure = figures.get(name)
        if figure and figure["mean"] is not None:
            share = name != "ece"  # ECE is not a share to show in %
            shown = (lambda v: f"{100 * v:.1f} %") if share else (lambda v: f"{v:.3f}")
            low, high = figure["low"], figure["high"]  # a share's interval ends at 0 and 1 (cross_validation.py)
            interval = "" if low is None else f" (95 % interval {shown(low)} to {shown(high)})"
            cited.append(f"{words} {shown(figure['mean'])}{interval}")
    this = (
        f"the mean of the {record['folds']} fold models"
        if record.get("epochs") is None
        else f"every image, {record['epochs']} epochs"
    )
    return [f"- Cross-validated ({record['folds']} folds; this model: {this}): " + "; ".join(cited)]


def markdown(card: dict) -> str:
    cost, source = card["cost"], card["source"]
    names = ", ".join(card["class_names"][:20]) + (" ..." if len(card["class_names"]) > 20 else "")
    parities = [
        f"- {artifact['file']} against PyTorch eager: {describe_parity(artifact['parity'])}"
        for artifact in card["artifacts"].values()
        if artifact["parity"]
    ]
    return "\n".join(
        [
            "# Model card",
            "",
            f"- Network: {network_line(card['network'])}",
            f"- Input `{card['input']['name']}`: uint8 {card['input']['shape']}, {card['input']['layout']}; "
            f"{card['input']['normalization']}, mean {card['input']['mean']}, std {card['input']['std']}",
            f"- Resize: {card['input']['resize']}",
            f"- Output `{card['output']['name']}`: float32 {card['output']['shape']} {card['output']['meaning']}",
            f"- Classes ({len(card['class_names'])}): {names}",
            f"- Parameters: {cost['params']:,}; MACs per image: {cost['macs_per_image']:,}; "
            f"FLOPs per image: {cost['flops_per_image']:,}",
            source_line(source),
            f"- Weights: {source.get('weights', 'the training weights at that step')}",
            *calibration_lines(card.get("calibration")),
            *cross_validation_lines(card.get("cross_validation")),
            evaluation_line(card["evaluation"]),
            *int8_lines(card["int8"]),
            *parities,
            "",
            table(card),
            "",
        ]
    )


def write_card(card: dict, json_path: Path, markdown_path: Path) -> None:
    json_path.write_text(json.dumps(card, indent=2) + "\n")
    markdown_path.write_text(markdown(card))
