"""What k folds say together: every figure with its spread, and the out-of-fold answer for every image.

Each fold is an ordinary run (``folds.run_fold``): trained on the other folds, its shipped weights answer
the fold it never saw, calibrated as ``predict`` answers. From those answers, per fold:

- one label: ``top1``, ``macro_f1``, ``balanced_accuracy`` (the mean of the classes' recalls), ``ece`` (15
  bins) and ``recall/<class>``;
- several labels: ``mAP``, ``macro_f1`` and ``micro_f1`` at the fold's thresholds, ``labels_per_image`` given
  and ``ap/<class>``.

Over the folds: the mean, the standard deviation and a 95 % interval of the mean (Student's t with k - 1
degrees of freedom: folds are few, and the normal's 1.96 would claim too much), ending where the figure can
(a share's at 0 and 1).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torchmetrics.functional.classification import (
    multiclass_calibration_error,
    multiclass_f1_score,
    multilabel_average_precision,
)

from ..foundation.files import Partial
from .folds import FoldPredictions, shown_path

# Student's t at 0.975 by degrees of freedom (any statistics table): the 95 % interval of a mean of few folds.
T_975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    11: 2.201,
    12: 2.179,
    13: 2.160,
    14: 2.145,
    15: 2.131,
    16: 2.120,
    17: 2.110,
    18: 2.101,
    19: 2.093,
    20: 2.086,
    25: 2.060,
    30: 2.042,
    40: 2.021,
    60: 2.000,
    120: 1.980,
}
HEADLINE = {"multiclass": "top1", "multilabel": "mAP"}  # the figure the console leads with


def t_975(degrees: int) -> float:
    """Student's t quantile at 0.975 for ``degrees`` of freedom (beyond the table, the next larger entry's)."""
    if degrees < 1:
        return math.nan
    return T_975[min((known for known in T_975 if known >= degrees), default=120)]


@dataclass(frozen=True)
class Spread:
    """A figure over the folds: each fold's value, their mean, standard deviation and 95 % interval."""

    values: tuple[float, ...]
    bounds: tuple[float, float] = (-math.inf, math.inf)  # where the figure can lie: the interval ends there too

    @property
    def mean(self) -> float:
        return float(np.nanmean(self.values)) if not all(math.isnan(v) for v in self.values) else math.nan

    @property
    def std(self) -> float:
        known = [v for v in self.values if not math.isnan(v)]
        return float(np.std(known, ddof=1)) if len(known) > 1 else math.nan

    @property
    def interval(self) -> tuple[float, float]:
        known = [v for v in self.values if not math.isnan(v)]
        half = t_975(len(known) - 1) * self.std / math.sqrt(len(known)) if len(known) > 1 else math.nan
        if math.isnan(half):
            return math.nan, math.nan
        # The t interval of a few folds can pass a share's ends (a mean of 0.97 with a wide spread): clipped there.
        return max(self.mean - half, self.bounds[0]), min(self.mean + half, self.bounds[1])


def fold_figures(fold: FoldPredictions) -> dict[str, float]:
    """The figures of one fold's answers to the images it held out (module docstring)."""
    labels = torch.from_numpy(np.asarray(fold.images.labels).astype(np.int64))
    probabilities = torch.from_numpy(fold.calibrated).float()
    classes = len(fold.class_names)
    if fold.thresholds is not None:  # several labels
        given = probabilities >= torch.from_numpy(fold.thresholds).float()
        truth = labels.bool()
        true_positives = (given & truth).sum(0).double()
        per_class_f1 = 2 * true_positives / (given.sum(0) + truth.sum(0)).clamp(min=1)
        figures = {
            "mAP": float(multilabel_average_precision(probabilities, labels, num_labels=classes)),
            "macro_f1": float(per_class_f1[truth.sum(0) > 0].mean()),
            "micro_f1": float(2 * true_positives.sum() / max(float(given.sum() + truth.sum()), 1.0)),
            "labels_per_image": float(given.sum(1).double().mean()),
        }
        per_class = multilabel_average_precision(probabilities, labels, num_labels=classes, average="none")
        return figures | {f"ap/{name}": float(ap) for name, ap in zip(fold.class_names, per_class, strict=True)}
    predicted = probabilities.argmax(1)
    recalls = [
        float((predicted[labels == k] == k).double().mean()) if (labels == k).any() else math.nan
        for k in range(classes)
    ]
    figures = {
        "top1": float((predicted == labels).double().mean()),
        "macro_f1": float(multiclass_f1_score(predicted, labels, num_classes=classes, average="macro")),
        "balanced_accuracy": float(np.nanmean(recalls)),
        "ece": float(multiclass_calibration_error(probabilities, labels, num_classes=classes, n_bins=15)),
    }
    return figures | {f"recall/{name}": recall for name, recall in zip(fold.class_names, recalls, strict=True)}


COUNTS = ("labels_per_image",)  # the figures that are not shares in [0, 1]


def spreads(per_fold: list[dict[str, float]]) -> dict[str, Spread]:
    """Each figure over the folds, in the order the first fold gives them."""
    return {
        name: Spread(
            tuple(figures.get(name, math.nan) for figures in per_fold),
            (0.0, math.inf) if name in COUNTS else (0.0, 1.0),
        )
        for name in per_fold[0]
    }


def console_table(summary: dict[str, Spread], per_class: bool = False) -> str:
    """The summary as the console prints it (per-class figures only when asked: they are in the CSV)."""
    rows = [(name, spread) for name, spread in summary.items() if per_class or "/" not in name]
    width = max(len(name) for name, _ in rows)
    folds = len(next(iter(summary.values())).values)
    lines = [
        f"{'figure':<{width}}  {'mean':>7}  {'std':>7}  {'95 % interval':>17}  "
        + "  ".join(f"{f'fold {k}':>7}" for k in range(folds))
    ]
    for name, spread in rows:
        low, high = spread.interval
        values = "  ".join(f"{value:7.4f}" for value in spread.values)
        lines.append(f"{name:<{width}}  {spread.mean:7.4f}  {spread.std:7.4f}  [{low:7.4f}, {high:7.4f}]  {values}")
    return "\n".join(lines)


def write_summary(summary: dict[str, Spread], output: Path) -> None:
    """``cv_summary.csv``: one row per figure: mean, std, the 95 % interval, then each fold's value."""
    folds = len(next(iter(summary.values())).values)
    with Partial(output) as path, open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["figure", "mean", "std", "ci95_low", "ci95_high", *(f"fold_{k}" for k in range(folds))])
        for name, spread in summary.items():
            low, high = spread.interval
            writer.writerow([name, *(f"{v:.6f}" for v in (spread.mean, spread.std, low, high, *spread.values))])


def given_labels(fold: FoldPredictions, index: int) -> str:
    labels = np.asarray(fold.images.labels)
    if fold.thresholds is not None:
        return " ".join(fold.class_names[k] for k in np.flatnonzero(labels[index]))
    return fold.class_names[int(labels[index])]


def answered_labels(fold: FoldPredictions, index: int) -> tuple[str, float]:
    """(what the fold's model answers, the probability it gives its answer or, several, its least sure label)."""
    row = fold.calibrated[index]
    if fold.thresholds is not None:
        given = np.flatnonzero(row >= fold.thresholds)
        return " ".join(fold.class_names[k] for k in given), float(row[given].min()) if len(given) else 0.0
    return fold.class_names[int(row.argmax())], float(row.max())


def write_out_of_fold(folds: list[FoldPredictions], output: Path) -> None:
    """``oof_predictions.csv``: every image, its fold, its given label(s), the answer of the model that never saw
    it (calibrated), whether that is right, and every class's probability."""
    class_names = folds[0].class_names
    with Partial(output) as path, open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            ["image", "fold", "given", "predicted", "probability", "correct", *(f"p:{name}" for name in class_names)]
        )
        for number, fold in enumerate(folds):
            for index, name in enumerate(fold.images.names):
                given = given_labels(fold, index)
                answer, probability = answered_labels(fold, index)
                writer.writerow(
                    [
                        shown_path(name, fold.image_root),
                        number,
                        given,
                        answer,
                        f"{probability:.4f}",
                        int(answer == given),
                        *(f"{p:.4f}" for p in fold.calibrated[index]),
                    ]
                )


def wrong_answers(folds: list[FoldPredictions], limit: int) -> list[tuple[int, int, str, float]]:
    """The out-of-fold answers that are wrong, surest first: (fold number, position, answer, its probability)."""
    wrong = []
    for number, fold in enumerate(folds):
        for index in range(len(fold.images.names)):
            answer, probability = answered_labels(fold, index)
            if answer != given_labels(fold, index):
                wrong.append((number, index, answer, probability))
    return sorted(wrong, key=lambda item: -item[3])[:limit]


def pooled_confusion(folds: list[FoldPredictions]) -> np.ndarray:
    """Counts (given, answered) over every fold's held-out images (one label per image)."""
    classes = len(folds[0].class_names)
    matrix = np.zeros((classes, classes), dtype=np.int64)
    for fold in folds:
        np.add.at(matrix, (np.asarray(fold.images.labels).astype(np.int64), fold.calibrated.argmax(1)), 1)
    return matrix


def write_tensorboard(summary: dict[str, Spread], folder: Path) -> None:
    """One scalar per fold (the step is the fold) under ``cv/``, beside the fold runs' own logs."""
    from torch.utils.tensorboard import SummaryWriter

    for stale in folder.glob("events.out.tfevents.*"):  # an earlier summary of the same folds: replaced, not doubled
        stale.unlink()
    writer = SummaryWriter(str(folder))
    try:
        for name, spread in summary.items():
            for fold, value in enumerate(spread.values):
                if not math.isnan(value):
                    writer.add_scalar(f"cv/{name}", value, global_step=fold)
    finally:
        writer.close()


LOWER_IS_BETTER = ("ece",)


@dataclass(frozen=True)
class Difference:
    """A figure of two cross-validations on the same folds: A's and B's spread, and B - A fold by fold."""

    a: Spread
    b: Spread
    b_minus_a: Spread

    def verdict(self, name: str) -> str:
        """Which is better on these folds, where the 95 % interval of the mean difference excludes 0."""
        low, high = self.b_minus_a.interval
        if math.isnan(low) or low <= 0 <= high:
            return "no difference shown"
        b_higher = low > 0
        return "B better" if b_higher != (name in LOWER_IS_BETTER) else "A better"


def paired(a: dict[str, Spread], b: dict[str, Spread]) -> dict[str, Difference]:
    """Each figure both give, with the per-fold differences B - A (the same folds: a paired comparison)."""
    return {
        name: Difference(
            a[name], b[name], Spread(tuple(y - x for x, y in zip(a[name].values, b[name].values, strict=True)))
        )
        for name in a
        if name in b
    }


def comparison_table(comparison: dict[str, Difference]) -> str:
    rows = [(name, difference) for name, difference in comparison.items() if "/" not in name]
    width = max(len(name) for name, _ in rows)
    lines = [f"{'figure':<{width}}  {'A':>7}  {'B':>7}  {'B - A':>8}  {'95 % interval':>19}  verdict"]
    for name, difference in rows:
        low, high = difference.b_minus_a.interval
        means = f"{difference.a.mean:7.4f}  {difference.b.mean:7.4f}  {difference.b_minus_a.mean:+8.4f}"
        lines.append(f"{name:<{width}}  {means}  [{low:+8.4f}, {high:+8.4f}]  {difference.verdict(name)}")
    return "\n".join(lines)


def write_comparison(comparison: dict[str, Difference], output: Path) -> None:
    """``cv_compare.csv``: per figure, A's and B's means, the mean difference B - A, its 95 % interval, the
    verdict, then each fold's difference."""
    folds = len(next(iter(comparison.values())).b_minus_a.values)
    with Partial(output) as path, open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            [
                "figure",
                "a_mean",
                "b_mean",
                "b_minus_a",
                "ci95_low",
                "ci95_high",
                "verdict",
                *(f"fold_{k}" for k in range(folds)),
            ]
        )
        for name, difference in comparison.items():
            low, high = difference.b_minus_a.interval
            numbers = (difference.a.mean, difference.b.mean, difference.b_minus_a.mean, low, high)
            writer.writerow(
                [
                    name,
                    *(f"{v:.6f}" for v in numbers),
                    difference.verdict(name),
                    *(f"{v:.6f}" for v in difference.b_minus_a.values),
                ]
            )
