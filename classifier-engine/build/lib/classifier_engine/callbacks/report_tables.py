"""The figures of an evaluation report, from predicted probabilities and true labels alone (no model, no images)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ClassFigures:
    """One class's row of the per-class table."""

    name: str
    precision: float
    recall: float
    f1: float
    support: int
    confused_with: str  # the other class its images are most often taken for ("" when none is)
    confused_share: float  # the share of its images taken for that class


def confusion_counts(labels: np.ndarray, predicted: np.ndarray, classes: int) -> np.ndarray:
    """(classes, classes) counts: row = true class, column = predicted class."""
    return np.bincount(labels * classes + predicted, minlength=classes * classes).reshape(classes, classes)


def per_class(confusion: np.ndarray, class_names: list[str]) -> list[ClassFigures]:
    """Precision, recall, F1 and support of each class, and the class it is most confused with."""
    hits = np.diag(confusion).astype(np.float64)
    support, claimed = confusion.sum(axis=1), confusion.sum(axis=0)
    precision = np.divide(hits, claimed, out=np.zeros_like(hits), where=claimed > 0)
    recall = np.divide(hits, support, out=np.zeros_like(hits), where=support > 0)
    total = precision + recall
    f1 = np.divide(2 * precision * recall, total, out=np.zeros_like(hits), where=total > 0)
    others = confusion.copy()
    np.fill_diagonal(others, 0)
    rows = []
    for k, name in enumerate(class_names):
        worst = int(others[k].argmax())
        confused = others[k, worst] > 0
        rows.append(
            ClassFigures(
                name,
                float(precision[k]),
                float(recall[k]),
                float(f1[k]),
                int(support[k]),
                class_names[worst] if confused else "",
                float(others[k, worst] / support[k]) if confused else 0.0,
            )
        )
    return rows


def confident_mistakes(probabilities: np.ndarray, labels: np.ndarray, count: int) -> np.ndarray:
    """The indices of the ``count`` wrong answers given with the highest probability, most confident first."""
    predicted = probabilities.argmax(axis=1)
    wrong = np.flatnonzero(predicted != labels)
    confidence = probabilities[wrong, predicted[wrong]]
    return wrong[np.argsort(-confidence, kind="stable")[:count]]


def top_k_accuracy(probabilities: np.ndarray, labels: np.ndarray, k: int) -> float:
    k = min(k, probabilities.shape[1])
    top = np.argpartition(-probabilities, k - 1, axis=1)[:, :k]
    return float((top == labels[:, None]).any(axis=1).mean()) if len(labels) else 0.0
