"""The labels that look wrong, ranked from the folds' out-of-sample answers (``folds.py``).

Every image's probabilities come from a model that did not see it, as confident learning requires
(Northcutt et al., 2021). cleanlab ranks them; for several labels per image, by its multi-label ranking
(every class one-vs-rest).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..foundation import html_page
from ..foundation.files import Partial
from .folds import FoldPredictions, shown_path


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
            writer.writerow(
                [
                    shown_path(issues.names[index], root),
                    issues.given(index, class_names),
                    issues.suggested(index, class_names),
                    f"{issues.scores[index]:.4f}",
                ]
            )


def write_gallery(
    issues: LabelIssues,
    folds: list[FoldPredictions],
    class_names: list[str],
    output: Path,
    root: str | None,
    limit: int,
) -> None:
    """``output`` (HTML): the ``limit`` worst-ranked images with their given and suggested labels."""
    where = [(fold, position) for fold in folds for position in range(len(fold.images.labels))]
    figures = []
    for index in issues.ranked[:limit]:
        fold, position = where[index]
        pixels = np.asarray(fold.images.images[np.array([position])])[0].transpose(1, 2, 0)
        figures.append(
            html_page.figure(
                [html_page.image(pixels, issues.names[index])],
                [
                    f"given: {issues.given(index, class_names) or '(none)'}",
                    f"suggested: {issues.suggested(index, class_names) or '(none)'}",
                    f"label quality {issues.scores[index]:.3f}",
                    shown_path(issues.names[index], root),
                ],
            )
        )
    flagged, total = len(issues.ranked), len(issues.labels)
    summary = html_page.table(
        None,
        [
            ("images checked", total),
            ("labels that look wrong", f"{flagged} ({100 * flagged / max(total, 1):.1f} %)"),
            ("folds (runs)", ", ".join(str(fold.run_dir) for fold in folds)),
        ],
        text_columns=2,
    )
    note = "" if flagged <= limit else html_page.paragraph(f"The worst {limit}; the CSV lists all {flagged}.", True)
    body = note + (f'<div class="gallery">{"".join(figures)}</div>' if figures else html_page.paragraph("None."))
    page = html_page.page("Labels that look wrong", [("Summary", summary), ("Worst first", body)])
    with Partial(output) as path:
        path.write_text(page, encoding="utf-8")
