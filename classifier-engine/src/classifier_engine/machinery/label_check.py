"""Out-of-sample probabilities for every training image by k-fold cross-validation, and the labels that look wrong.

Each fold is an ordinary ``main.py fit`` run with ``data.folds`` and ``data.fold`` set: its own run
directory (named by its config, so resumable and reused), trained on the other folds and validated on
its own. Its shipped weights (``last.ckpt``'s, the averaged ones where a recipe averages) then
predict the fold's images, which it never trained on: every image gets a probability vector from a
model that did not see it, as confident learning requires (Northcutt et al., 2021). cleanlab ranks them;
for several labels per image, by its multi-label ranking (every class one-vs-rest).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import numpy as np
import torch
from typing_extensions import override

from ..data.interfaces import FoldedData, HeldOutImages
from ..foundation import html_page
from ..foundation.errors import UsageError
from ..foundation.files import Partial
from ..models.domain import find_head
from ..models.network_parts import logits_and_features
from .checkpoint_io import read_checkpoint
from .checkpoint_values import check_fits
from .cli import TrainerCLI


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
    return FoldPredictions(where.run_dir, images, probabilities, list(model.class_names), str(root) if root else None,
                           calibrated, thresholds, logits.numpy(), None if knn is None else knn.numpy())  # fmt: skip


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


@dataclass(frozen=True)
class LabelIssues:
    """Every image in the order of its fold, and the ranked rows (worst first) whose label looks wrong."""

    names: list[str]
    labels: np.ndarray  # (N,) classes, or multi-label (N, classes) 0/1
    probabilities: np.ndarray
    scores: np.ndarray  # label quality in [0, 1]: the probability the fold's model gave the given label
    ranked: np.ndarray  # indices of the images flagged by confident learning, worst first

    @property
    def multilabel(self) -> bool:
        return self.labels.ndim == 2

    def given(self, index: int, class_names: list[str]) -> str:
        """The label (several: separated by spaces) the image was given."""
        if self.multilabel:
            return " ".join(class_names[k] for k in np.flatnonzero(self.labels[index]))
        return class_names[self.labels[index]]

    def suggested(self, index: int, class_names: list[str]) -> str:
        """What the fold's model says instead: its top class, or every class it gives p >= 0.5."""
        if self.multilabel:
            return " ".join(class_names[k] for k in np.flatnonzero(self.probabilities[index] >= 0.5))
        return class_names[int(self.probabilities[index].argmax())]


def find_issues(folds: list[FoldPredictions]) -> LabelIssues:
    """Confident learning over all folds' out-of-sample probabilities (cleanlab's ``find_label_issues``)."""
    from cleanlab.filter import find_label_issues
    from cleanlab.rank import get_label_quality_scores

    names = [name for fold in folds for name in fold.images.names]
    labels = np.concatenate([np.asarray(fold.images.labels) for fold in folds]).astype(np.int64)
    probabilities = np.concatenate([fold.probabilities for fold in folds])
    if labels.ndim == 2:  # several labels per image: cleanlab's multi-label ranking
        from cleanlab.multilabel_classification import get_label_quality_scores as multilabel_scores

        given = [np.flatnonzero(row).tolist() for row in labels]
        ranked = find_label_issues(given, probabilities, multi_label=True, return_indices_ranked_by="self_confidence")
        scores = multilabel_scores(given, probabilities)
        return LabelIssues(names, labels, probabilities, scores, np.asarray(ranked, dtype=np.int64))
    ranked = find_label_issues(labels, probabilities, return_indices_ranked_by="self_confidence")
    scores = get_label_quality_scores(labels, probabilities, method="self_confidence")
    return LabelIssues(names, labels, probabilities, scores, np.asarray(ranked, dtype=np.int64))


def write_issues(issues: LabelIssues, class_names: list[str], output: Path, root: str | None) -> None:
    """``output`` (CSV: file, given label, suggested label, score; worst first)."""
    with Partial(output) as path, open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["file", "given_label", "suggested_label", "score"])
        for index in issues.ranked:
            writer.writerow([shown_path(issues.names[index], root), issues.given(index, class_names),
                             issues.suggested(index, class_names), f"{issues.scores[index]:.4f}"])  # fmt: skip


def shown_path(name: str, root: str | None) -> str:
    return str(Path(root, name)) if root else name


def write_gallery(
    issues: LabelIssues, folds: list[FoldPredictions], class_names: list[str], output: Path, root: str | None,
    limit: int,
) -> None:  # fmt: skip
    """``output`` (HTML): the ``limit`` worst-ranked images with their given and suggested labels."""
    where = [(fold, position) for fold in folds for position in range(len(fold.images.labels))]
    figures = []
    for index in issues.ranked[:limit]:
        fold, position = where[index]
        pixels = np.asarray(fold.images.images[np.array([position])])[0].transpose(1, 2, 0)
        figures.append(html_page.figure([html_page.image(pixels, issues.names[index])], [
            f"given: {issues.given(index, class_names) or '(none)'}",
            f"suggested: {issues.suggested(index, class_names) or '(none)'}",
            f"label quality {issues.scores[index]:.3f}", shown_path(issues.names[index], root),
        ]))  # fmt: skip
    flagged, total = len(issues.ranked), len(issues.labels)
    summary = html_page.table(None, [
        ("images checked", total), ("labels that look wrong", f"{flagged} ({100 * flagged / max(total, 1):.1f} %)"),
        ("folds (runs)", ", ".join(str(fold.run_dir) for fold in folds)),
    ], text_columns=2)  # fmt: skip
    note = "" if flagged <= limit else html_page.paragraph(f"The worst {limit}; the CSV lists all {flagged}.", True)
    body = note + (f'<div class="gallery">{"".join(figures)}</div>' if figures else html_page.paragraph("None."))
    page = html_page.page("Labels that look wrong", [("Summary", summary), ("Worst first", body)])
    with Partial(output) as path:
        path.write_text(page, encoding="utf-8")
