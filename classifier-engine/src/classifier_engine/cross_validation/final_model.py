"""A cross-validation's final model (``cross_validate.py --final all``): every image trained on, nothing held back.

The folds measured the recipe; the model to ship is then trained on all their images, as an ordinary
``main.py fit`` run (``data.fold`` null: no fold is held out and nothing is validated), for the folds' mean
best epoch count. Having no images of its own to be calibrated on, it takes its calibration from the folds:

- the temperature, the multi-label thresholds, the likely-mistake and every "unknown" threshold are fitted on
  the pooled out-of-fold answers (each image answered by the fold model that never trained on it: the answers
  of models of this recipe to images they did not see, which is what a calibration needs);
- the bank of the ``knn`` score holds its own training images' features, and its threshold is the folds'
  (the score is a distance between L2-normalized features, on a like scale for models of one recipe; how
  close, the docs' cross_validation page gives as measured).

``checkpoints/final.ckpt`` is the run's ``last.ckpt`` with that calibration and the cross-validated figures
(``"cross_validation"``), which its model card cites; ``last.ckpt`` stays as training wrote it.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch

from ..callbacks.linear_probe import ProbeChoice
from ..checkpoints.checkpoint_io import AtomicCheckpointIO, read_checkpoint, stored_entry
from ..checkpoints.checkpoint_values import check_fits
from ..cli.model_guarantees import training_features
from ..cli.trainer_cli import TrainerCLI
from ..export.model_card import CARD_JSON, CROSS_VALIDATION_KEY
from ..foundation.files import sha256
from ..models.calibration import BANK_KEY, CHECKPOINT_KEY
from ..models.domain import normalized_bank
from .fold_figures import HEADLINE, Spread
from .folds import FoldPredictions, RunDirectory
from .report import logged_curve

FINAL = "final.ckpt"  # beside the final run's last.ckpt
# What Lightning says of a run that validates nothing, as this one never does on purpose: no validation images,
# and no validation figure for the config's best-checkpoint writer (its last.ckpt is the model).
NOTHING_TO_VALIDATE = (r"Total length of .* across ranks is zero", r"`ModelCheckpoint\(monitor=.*could not find")


def best_epoch_count(run_dir: Path, task: str) -> int | None:
    """After how many epochs a fold's run validated best: the highest top-1 (mAP), ties to the lower loss."""
    headline = logged_curve(run_dir, f"val/{HEADLINE[task]}")
    if not headline:
        return None
    loss = dict(logged_curve(run_dir, "val/loss"))
    epochs = dict(logged_curve(run_dir, "epoch"))
    step, _ = max(headline, key=lambda point: (point[1], -loss.get(point[0], 0.0)))
    if step in epochs:  # the epoch Lightning logged at that step, counted from 0
        return int(epochs[step]) + 1
    return [point[0] for point in headline].index(step) + 1  # one validation per epoch


def final_epochs(folds: list[FoldPredictions], task: str) -> int:
    """The folds' mean best epoch count, rounded (at least 1)."""
    counts = [count for count in (best_epoch_count(fold.run_dir, task) for fold in folds) if count is not None]
    if not counts:
        raise ValueError("no fold's run logged a validation figure to choose the final model's epochs by")
    return max(1, round(float(np.mean(counts))))


def probe_verdict(folds: list[FoldPredictions]) -> tuple[float, float] | None:
    """The folds' mean validation top-1 of their linear probes and of their fine-tunes, where every fold's
    ``LinearProbe`` compared the two (None otherwise: no probe, or the probe alone)."""
    choices = [ProbeChoice.of(read_checkpoint(fold.run_dir / "checkpoints" / "last.ckpt")) for fold in folds]
    if not choices or not all(choice is not None and choice.compared for choice in choices):
        return None
    return float(np.mean([c.probe_top1 for c in choices])), float(np.mean([c.fine_tune_top1 for c in choices]))


def train_final(
    fit_options: list[str],
    folds: int,
    epochs: int,
    model_class: type[L.LightningModule],
    default_config: Path,
    probe_alone: bool = False,
) -> tuple[TrainerCLI, Path]:
    """Train (or continue, or reuse) the final run on every fold; the CLI that did, and the run's folder.

    ``probe_alone``: the folds' linear probes beat their fine-tunes, so the final model is the probe alone
    (``--recipe probe``): with nothing held out, its own run could not compare the two.
    """
    where = RunDirectory()
    final = [
        f"--data.folds={folds}",
        "--data.fold=null",
        f"--trainer.max_epochs={epochs}",
        "--ckpt_path=last",
        "--allow_fresh_start=true",
    ]
    final += ["--recipe=probe"] if probe_alone else []
    with warnings.catch_warnings():
        for message in NOTHING_TO_VALIDATE:
            warnings.filterwarnings("ignore", message=message, category=UserWarning)
        cli = TrainerCLI(
            model_class,
            default_config=default_config,
            args=["fit", *fit_options, *final],
            trainer_defaults={"callbacks": [where]},
        )
    return cli, where.run_dir


def pooled_answers(folds: list[FoldPredictions]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Every image's out-of-fold logits, its labels, and its ``knn`` score (None unless every fold gave one)."""
    logits = torch.from_numpy(np.concatenate([fold.logits for fold in folds])).float()
    labels = torch.from_numpy(np.concatenate([np.asarray(fold.images.labels) for fold in folds]).astype(np.int64))
    knn = None
    if all(fold.knn is not None for fold in folds):
        knn = torch.from_numpy(np.concatenate([fold.knn for fold in folds])).float()
    return logits, labels, knn


def figures_record(summary: dict[str, Spread], folds: int, epochs: int | None) -> dict[str, Any]:
    """The cross-validated figures as plain numbers, for the checkpoint and the card (``epochs``: the final model's;
    None for the fold models' ensemble)."""

    def plain(value: float) -> float | None:
        return None if math.isnan(value) else value

    figures = {}
    for name, spread in summary.items():
        low, high = spread.interval
        figures[name] = {"mean": plain(spread.mean), "std": plain(spread.std), "low": plain(low), "high": plain(high)}
    return {"folds": folds, "epochs": epochs, "figures": figures}


def calibrate_final(
    cli: TrainerCLI, run_dir: Path, folds: list[FoldPredictions], summary: dict[str, Spread], epochs: int
) -> Path:
    """Write ``checkpoints/final.ckpt``: the final run's last checkpoint, calibrated on the folds' answers."""
    last = run_dir / "checkpoints" / "last.ckpt"
    target = last.with_name(FINAL)
    record = figures_record(summary, len(folds), epochs) | {"last_sha256": sha256(last)}
    if target.is_file() and stored_entry(target, CROSS_VALIDATION_KEY) == record:
        return target  # written from this very last.ckpt and these folds before: kept byte for byte
    checkpoint = read_checkpoint(last)
    model = cli.model
    check_fits(checkpoint, model, last)
    model.load_state_dict(checkpoint["state_dict"])  # the shipped weights (the average, where a recipe keeps one)
    model.eval()
    features = training_features(cli.trainer, model)
    logits, labels, knn = pooled_answers(folds)
    if model.calibration.multilabel:
        labels = labels.float()
    bank = normalized_bank(features) if features is not None and len(features) else None
    model.calibration.fit_answers(logits, labels, knn, split="out-of-fold", bank=bank)
    checkpoint.pop(BANK_KEY, None)
    checkpoint.pop(CHECKPOINT_KEY, None)
    model.calibration.save_to(checkpoint)
    checkpoint[CROSS_VALIDATION_KEY] = record
    AtomicCheckpointIO().save_checkpoint(checkpoint, target)
    return target


def exported_from(folder: Path, key: str, value: Any) -> bool:
    """Whether ``folder`` holds a whole export whose card's ``source[key]`` is ``value``: made from this very
    checkpoint (or these very fold checkpoints) before, so a rerun keeps it byte for byte."""
    try:
        return json.loads((folder / CARD_JSON).read_text())["source"][key] == value
    except (OSError, ValueError, KeyError, TypeError):
        return False
