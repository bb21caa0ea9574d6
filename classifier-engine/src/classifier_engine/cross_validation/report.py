"""``cv_report.html``: one self-contained page of what the folds say together.

The summary (every figure with its spread), the model to ship (the final model or the fold ensemble, once it
is made), each fold's validation curve as its run logged it, the pooled
out-of-fold confusion matrix (one label per image) and the images the fold models got wrong, surest first.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # draw into images only; never open a window
import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np

from ..foundation import html_page
from ..foundation.files import Partial
from .fold_figures import HEADLINE, Spread, given_labels, pooled_confusion, wrong_answers
from .folds import FoldPredictions, shown_path


def logged_curve(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of ``tag`` in a run's TensorBoard events (empty where the run logged none)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    if tag not in events.Tags().get("scalars", []):
        return []
    return [(event.step, event.value) for event in events.Scalars(tag)]


def curves_chart(folds: list[FoldPredictions], tag: str) -> np.ndarray | None:
    """Each fold's ``tag`` over its training steps, one line per fold."""
    figure, axes = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    try:
        drawn = 0
        for number, fold in enumerate(folds):
            curve = logged_curve(fold.run_dir, tag)
            if curve:
                steps, values = zip(*curve, strict=True)
                axes.plot(steps, values, marker="o", markersize=3, label=f"fold {number}")
                drawn += 1
        if not drawn:
            return None
        axes.set_xlabel("training step")
        axes.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        axes.set_ylabel(tag)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
        figure.tight_layout()
        figure.canvas.draw()
        return np.asarray(figure.canvas.buffer_rgba())[..., :3].copy()
    finally:
        plt.close(figure)


def summary_table(summary: dict[str, Spread]) -> str:
    folds = len(next(iter(summary.values())).values)
    rows = []
    for name, spread in summary.items():
        low, high = spread.interval
        values = [f"{value:.4f}" if not math.isnan(value) else "" for value in spread.values]
        rows.append([name, f"{spread.mean:.4f}", f"{spread.std:.4f}", f"[{low:.4f}, {high:.4f}]", *values])
    header = ["figure", "mean", "std", "95 % interval", *(f"fold {k}" for k in range(folds))]
    return html_page.table(header, rows)


def confusion_section(folds: list[FoldPredictions]) -> str:
    matrix = pooled_confusion(folds)
    names = folds[0].class_names
    shares = matrix / np.maximum(matrix.sum(axis=1, keepdims=True), 1)
    rows = [[name, *row] for name, row in zip(names, matrix.tolist(), strict=True)]
    note = html_page.paragraph("Rows: the label given; columns: the answer of the fold model that never saw the image.")
    return note + html_page.table(["given \\ answered", *names], rows, shades=shares)


def wrong_section(folds: list[FoldPredictions], limit: int) -> str:
    wrong = wrong_answers(folds, limit)
    if not wrong:
        return html_page.paragraph("Every out-of-fold answer is right.")
    figures = []
    for number, index, answer, probability in wrong:
        fold = folds[number]
        pixels = np.asarray(fold.images.images[np.array([index])])[0].transpose(1, 2, 0)
        name = fold.images.names[index]
        figures.append(
            html_page.figure(
                [html_page.image(pixels, name)],
                [
                    f"given: {given_labels(fold, index) or '(none)'}",
                    f"answered: {answer or '(none)'} ({probability:.2f})",
                    f"fold {number}",
                    shown_path(name, fold.image_root),
                ],
            )
        )
    return f'<div class="gallery">{"".join(figures)}</div>'


def shipped_section(shipped: str | list[tuple[str, str]]) -> str:
    """What the cross-validation made to ship: a sentence (none yet, none asked) or (what, where) rows."""
    if isinstance(shipped, str):
        return html_page.paragraph(shipped, note=True)
    return html_page.table(None, shipped, text_columns=2)


def write_report(
    folds: list[FoldPredictions],
    summary: dict[str, Spread],
    output: Path,
    limit: int = 48,
    shipped: str | list[tuple[str, str]] = "",
) -> None:
    """``output``: the summary, the model to ship (``shipped``), the curves, the pooled confusion matrix (one
    label) and the wrong answers."""
    multilabel = folds[0].thresholds is not None
    headline = HEADLINE["multilabel" if multilabel else "multiclass"]
    spread = summary[headline]
    low, high = spread.interval
    lead = html_page.paragraph(
        f"{len(folds)} folds, {sum(len(fold.images.names) for fold in folds)} images, each answered by the fold "
        f"model that never trained on it: {headline} {spread.mean:.4f} ± {spread.std:.4f} (95 % interval "
        f"{low:.4f} to {high:.4f})."
    )
    sections = [("Summary", lead + summary_table(summary))]
    if shipped:
        sections.append(("The model to ship", shipped_section(shipped)))
    for tag in (f"val/{headline}", "val/loss"):
        chart = curves_chart(folds, tag)
        if chart is not None:
            sections.append((f"{tag} of each fold", html_page.image(chart, f"{tag} of each fold")))
    if not multilabel:
        sections.append(("Pooled confusion matrix", confusion_section(folds)))
    sections.append(("Wrong answers, surest first", wrong_section(folds, limit)))
    runs = html_page.table(["fold", "run"], [(k, str(fold.run_dir)) for k, fold in enumerate(folds)], text_columns=2)
    sections.append(("The fold runs", runs))
    with Partial(output) as path:
        path.write_text(html_page.page("Cross-validation", sections), encoding="utf-8")
