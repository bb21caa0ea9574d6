"""The fold runner: out-of-sample probabilities for every training image by k-fold cross-validation.

Each fold is an ordinary ``main.py fit`` run with ``data.folds`` and ``data.fold`` set: its own run
directory (named by its config, so resumable and reused), trained on the other folds and validated on
its own. Its shipped weights (``last.ckpt``'s, the averaged ones where a recipe averages) then
predict the fold's images, which it never trained on: every image gets a probability vector from a
model that did not see it. ``cross_validate.py`` sums the folds up (``fold_figures.py``), ``check_labels.py``
ranks the labels that look wrong (``label_check.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import lightning as L
import numpy as np
import torch
from typing_extensions import override

from ..checkpoints.checkpoint_io import read_checkpoint
from ..checkpoints.checkpoint_values import check_fits
from ..cli.trainer_cli import TrainerCLI
from ..data.interfaces import FoldedData, HeldOutImages
from ..foundation.errors import UsageError
from ..models.domain import find_head
from ..models.network_parts import logits_and_features


@dataclass
class FoldPredictions:
    """One fold's held-out images and what the fold's model, which never trained on them, makes of them."""

    run_dir: Path
    images: HeldOutImages
    probabilities: np.ndarray  # (N, classes) float32: softmax, or multi-label each class's sigmoid
    class_names: list[str]
    image_root: str | None  # the folder the names are relative to (your images), if any
    calibrated: np.ndarray  # the same through the fold's calibration: what predict would answer
    thresholds: np.ndarray | None  # multi-label: the fold's per-class thresholds for giving a label
    logits: np.ndarray | None = None  # (N, classes) the fold model's uncalibrated logits
    knn: np.ndarray | None = None  # (N,) the "knn" score against the fold model's bank (None: it has none)


class RunDirectory(L.Callback):
    """Note where the fold's run lives (the CLI points ``default_root_dir`` at the run directory)."""

    def __init__(self) -> None:
        self.run_dir: Path | None = None

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.run_dir = Path(trainer.default_root_dir)


def refuse_fold_settings(command: str, fit_options: list[str], instead: str) -> None:
    """Refuse ``data.folds``/``data.fold`` among a fold command's fit options: the command sets them per fold."""
    names = {option.split("=", 1)[0].split(" ", 1)[0] for option in fit_options}
    if names & {"--data.folds", "--data.fold"}:
        raise UsageError(f"{command} sets data.folds and data.fold itself; {instead}")


def run_fold(
    fit_options: list[str], folds: int, fold: int, model_class: type[L.LightningModule], default_config: Path
) -> FoldPredictions:
    """Train (or resume, or reuse) fold ``fold``'s run, then predict its held-out images with its shipped weights."""
    where = RunDirectory()
    folded = [f"--data.folds={folds}", f"--data.fold={fold}", "--ckpt_path=last", "--allow_fresh_start=true"]
    cli = TrainerCLI(
        model_class,
        default_config=default_config,
        args=["fit", *fit_options, *folded],
        trainer_defaults={"callbacks": [where]},
    )
    data, model = cli.datamodule, cli.model
    if not isinstance(data, FoldedData):
        raise UsageError(f"{type(data).__name__} cannot hold out folds (data.folds, data.fold); use an ImageDataModule")
    last = where.run_dir / "checkpoints" / "last.ckpt"
    checkpoint = read_checkpoint(last)
    check_fits(checkpoint, model, last)
    model.load_state_dict(checkpoint["state_dict"])
    model.calibration.restore_from(checkpoint)  # the temperature and thresholds live beside the weights
    images = data.validation_images()
    root = getattr(data, "image_root", None)
    logits, features = predict(model, images.images, batch_size=256)
    calibration = model.calibration
    probabilities = (logits.sigmoid() if calibration.multilabel else logits.softmax(dim=-1)).numpy()
    calibrated = calibration.probabilities(logits).numpy()
    thresholds = calibration.thresholds.cpu().numpy() if calibration.multilabel else None
    knn = calibration.domain_scores(logits, features, "knn") if features is not None else None
    return FoldPredictions(
        where.run_dir,
        images,
        probabilities,
        list(model.class_names),
        str(root) if root else None,
        calibrated,
        thresholds,
        logits.numpy(),
        None if knn is None else knn.numpy(),
    )


def default_output(folds: list[FoldPredictions]) -> Path:
    """Where the findings go unless ``--output`` says: beside the fold runs, named by the first fold's run."""
    first = folds[0].run_dir
    return first.parent / f"label_issues-{first.name}.csv"


def predict(model: L.LightningModule, images: object, batch_size: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The logits of uint8 (N, 3, S, S) images (any indexable rows), with the model's test-time views, and the
    features its classifier head received in the same passes (None where no head can be found).

    Confident learning ranks their plain softmax (multi-label: sigmoid): a fold's temperature, fitted on
    the few images of its fold, could saturate them, and it estimates its own per-class thresholds anyway.
    The cross-validated answers are calibrated, as predict's are.
    """
    device = next(model.parameters()).device
    model.eval()
    logits, features = [], []
    with torch.inference_mode():
        head = None
        if len(images):
            try:
                head = find_head(model, torch.from_numpy(np.array(images[:1])).to(device))
            except ValueError:  # a network whose head cannot be watched: no "knn" score for its answers
                head = None
        for start in range(0, len(images), batch_size):
            batch = torch.from_numpy(np.array(images[start : start + batch_size])).to(device)
            if head is None:
                logits.append(model.evaluate(batch).float().cpu())
                continue
            out, seen = logits_and_features(head, lambda batch=batch: model.evaluate(batch))
            logits.append(out.float().cpu())
            features.append(seen.float().cpu())
    return torch.cat(logits), torch.cat(features) if features else None


def shown_path(name: str, root: str | None) -> str:
    return str(Path(root, name)) if root else name
