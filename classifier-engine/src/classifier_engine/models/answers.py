"""One image's answer, as ``predict`` writes it in ``predictions.csv`` and the server returns it as JSON.

Both read the same arrays: the calibrated probabilities, which images are like the training ones, which get an
answer (one label) or which labels each gets (several), and the "unknown" score. One function makes the answer
from them, so a served model answers exactly as ``predict`` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

UNKNOWN = "unknown"
UNLIKE_TRAINING = "unlike the training images"  # the domain score is below its threshold
UNSURE = "likely a mistake"  # the top probability is below the threshold that keeps most correct answers


@dataclass(frozen=True)
class Answer:
    """What a model says of one image: its label (or labels), their probabilities, why it is "unknown" if it
    is, its score against the training images, and the most probable classes."""

    multilabel: bool
    labels: tuple[str, ...]  # one label (or several); none where the answer is "unknown"
    probabilities: tuple[float, ...]  # one label: the top class's, even when unknown; several: each label's
    unknown_because: str  # "" where the model answers
    score: float | None  # how like the training images (None: the model has no such score)
    top: tuple[tuple[str, float], ...]  # the most probable classes, most probable first

    @property
    def unknown(self) -> bool:
        return bool(self.unknown_because)

    def cells(self) -> list[str]:
        """The row of ``predictions.csv`` after the image's name."""
        score = "" if self.score is None else f"{self.score:.6g}"
        top = " ".join(f"{name}:{probability:.4f}" for name, probability in self.top)
        if self.multilabel:
            labels = UNKNOWN if self.unknown_because else " ".join(self.labels)
            shares = " ".join(f"{probability:.4f}" for probability in self.probabilities)
            return [labels, shares, self.unknown_because, score, top]
        predicted = self.labels[0] if self.labels else UNKNOWN
        return [predicted, f"{self.probabilities[0]:.4f}", self.unknown_because, score, top]

    def as_json(self) -> dict:
        """The server's answer: the same fields, the probabilities in full."""
        if self.multilabel:
            answer: dict = {"labels": list(self.labels), "probabilities": list(self.probabilities)}
        else:
            answer = {"label": self.labels[0] if self.labels else UNKNOWN, "probability": self.probabilities[0]}
        return answer | {
            "unknown": self.unknown,
            "unknown_because": self.unknown_because or None,
            "score": self.score,
            "top": [{"label": name, "probability": probability} for name, probability in self.top],
        }


def top_classes(probabilities: np.ndarray, k: int) -> np.ndarray:
    """The indices of each row's ``k`` most probable classes, most probable first (ties: the lower index)."""
    return np.argsort(-probabilities, axis=-1, kind="stable")[:, :k]


def answers(
    probabilities: np.ndarray,
    class_names: Sequence[str],
    in_domain: np.ndarray | None = None,
    answered: np.ndarray | None = None,
    labels: np.ndarray | None = None,
    scores: np.ndarray | None = None,
    top_k: int = 5,
) -> list[Answer]:
    """Each image's answer from a batch's arrays: ``probabilities`` (N, classes) calibrated; ``in_domain`` (N,)
    like the training images (default: all); one label: ``answered`` (N,) gets a class (default: all); several:
    ``labels`` (N, classes) the labels each gets; ``scores`` (N,) the "unknown" score."""
    count = len(probabilities)
    inside = np.ones(count, dtype=bool) if in_domain is None else np.asarray(in_domain, dtype=bool)
    top = top_classes(probabilities, min(top_k, probabilities.shape[-1]))
    found = []
    for row in range(count):
        ranked = tuple((class_names[c], float(probabilities[row, c])) for c in top[row])
        score = None if scores is None else float(scores[row])
        because = "" if inside[row] else UNLIKE_TRAINING
        if labels is not None:
            present = sorted(np.flatnonzero(labels[row]), key=lambda k: -float(probabilities[row, k]))
            present = present if inside[row] else []
            names = tuple(class_names[k] for k in present)
            shares = tuple(float(probabilities[row, k]) for k in present)
            found.append(Answer(True, names, shares, because, score, ranked))
            continue
        given = True if answered is None else bool(answered[row])
        because = because or ("" if given else UNSURE)
        names = (ranked[0][0],) if given else ()
        found.append(Answer(False, names, (ranked[0][1],), because, score, ranked))
    return found
