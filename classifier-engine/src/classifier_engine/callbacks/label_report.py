"""The report's sections on probabilities: calibration before and after, "unknown" answers, several labels.

Pure functions of logits-derived arrays and true labels (no model, no images), each returning the
headline figures it adds and the HTML of its section; the charts are matplotlib figures embedded as PNG.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # draw into images only; never open a window

import matplotlib.pyplot as plt
import numpy as np
import torch
from torchmetrics.functional.classification import multilabel_average_precision

from ..foundation import html_page
from ..models.calibration import reliability

CHART_INCHES, DPI = (4.2, 3.2), 100


def _pixels(figure) -> np.ndarray:
    figure.tight_layout()
    figure.canvas.draw()
    pixels = np.asarray(figure.canvas.buffer_rgba())[..., :3].copy()
    plt.close(figure)
    return pixels


def reliability_chart(confidence: np.ndarray, correct: np.ndarray, title: str, ece: float) -> np.ndarray:
    """Accuracy against confidence per bin (the diagonal is perfect calibration), bars shaded by their images."""
    rows = reliability(confidence, correct)
    figure, axes = plt.subplots(figsize=CHART_INCHES, dpi=DPI)
    counts = np.array([count for _, _, count in rows], dtype=float)
    centres = (np.arange(len(rows)) + 0.5) / len(rows)
    shade = 0.25 + 0.75 * counts / max(counts.max(), 1)
    axes.bar(
        centres,
        [accuracy for _, accuracy, _ in rows],
        width=1 / len(rows),
        edgecolor="#1f4e79",
        color=[(0.12, 0.31, 0.47, alpha) for alpha in shade],
        label="accuracy in the bin",
    )
    axes.plot([0, 1], [0, 1], color="#c0392b", linestyle="--", linewidth=1, label="perfectly calibrated")
    axes.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence", ylabel="accuracy", title=f"{title} (ECE {ece:.3f})")
    axes.legend(loc="upper left", fontsize=7)
    return _pixels(figure)


def calibration_section(
    plain: np.ndarray, calibrated: np.ndarray, labels: np.ndarray, temperature: list[float], multilabel: bool
) -> tuple[dict[str, str], str]:
    """ECE and reliability diagrams before and after temperature scaling (multi-label: every class's answers)."""
    from ..models.calibration import calibration_error

    target = torch.from_numpy(labels.astype(np.float32) if multilabel else labels)
    ece_before = calibration_error(torch.from_numpy(plain), target, multilabel)
    ece_after = calibration_error(torch.from_numpy(calibrated), target, multilabel)
    charts = []
    for title, probabilities, ece in (("uncalibrated", plain, ece_before), ("calibrated", calibrated, ece_after)):
        if multilabel:  # each (image, class) answer: its probability of "present" against whether it is
            confidence, correct = probabilities.ravel(), labels.ravel().astype(bool)
        else:
            confidence, correct = probabilities.max(axis=1), probabilities.argmax(axis=1) == labels
        charts.append(html_page.image(reliability_chart(confidence, correct, title, ece), f"{title} reliability"))
    shown = f"{temperature[0]:.3f}" if len(temperature) == 1 else f"{min(temperature):.2f} to {max(temperature):.2f}"
    kind = "per class, averaged over the classes" if multilabel else "15 bins of the top class's probability"
    headline = {
        "calibration error (ECE)": f"{ece_after:.4f} calibrated, {ece_before:.4f} before",
        "temperature": shown + (" (one per class)" if len(temperature) > 1 else ""),
    }
    text = (
        f"Expected calibration error ({kind}): {ece_before:.4f} before temperature scaling, {ece_after:.4f} after "
        f"(temperature {shown}, fitted on the validation split). A bar below the diagonal is over-confident."
    )
    body = html_page.paragraph(text) + f'<div class="gallery">{"".join(charts)}</div>'
    return headline, body


def coverage_curve(scores: np.ndarray, correct: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(coverage, accuracy of the answers given) when answering only the most sure images first."""
    order = np.argsort(-scores, kind="stable")
    hits = np.cumsum(correct[order])
    answered = np.arange(1, len(scores) + 1)
    return answered / len(scores), hits / answered


def coverage_section(
    scores: np.ndarray, correct: np.ndarray, threshold: float, score_name: str
) -> tuple[dict[str, str], str]:
    """Selective classification: accuracy against the share of images answered, the fitted threshold marked."""
    coverage, accuracy = coverage_curve(scores, correct)
    answered = scores >= threshold
    share = float(answered.mean()) if len(scores) else 0.0
    kept = float(correct[answered].mean()) if answered.any() else 0.0
    figure, axes = plt.subplots(figsize=CHART_INCHES, dpi=DPI)
    axes.plot(coverage, accuracy, color="#1f4e79", linewidth=1.5)
    axes.axvline(share, color="#c0392b", linestyle="--", linewidth=1, label=f"threshold: {100 * share:.1f} % answered")
    axes.set(
        xlim=(0, 1),
        xlabel="coverage (share of images answered)",
        ylabel="accuracy of the answers",
        title="Accuracy against coverage",
    )
    axes.legend(loc="lower left", fontsize=7)
    chart = html_page.image(_pixels(figure), "accuracy against coverage")
    headline = {"not a likely mistake": f"{100 * share:.2f} % of the images, {100 * kept:.2f} % of them right"}
    text = (
        f'Predict answers "unknown" for a likely mistake: the {score_name} below {threshold:.4f}, the threshold that '
        f"keeps the configured share of correct validation answers. On these images it answers {100 * share:.2f} %, "
        f"{100 * kept:.2f} % of them correctly (all images: {100 * float(correct.mean()):.2f} %)."
    )
    return headline, html_page.paragraph(text) + chart


def unusual_section(
    scores: np.ndarray, threshold: float, score_name: str, images: np.ndarray | None, paths: list[str], count: int = 12
) -> tuple[dict[str, str], str]:
    """How like the training images the test images are: the share the threshold keeps, the curve of that share
    over the threshold, and the ``count`` images least like them (``images``: uint8 (N, 3, S, S), or None)."""
    inside = scores >= threshold
    share = float(inside.mean()) if len(scores) else 0.0
    ordered = np.sort(scores)
    figure, axes = plt.subplots(figsize=CHART_INCHES, dpi=DPI)
    axes.plot(ordered, 1 - np.arange(len(ordered)) / max(len(ordered), 1), color="#1f4e79", linewidth=1.5)
    axes.axvline(threshold, color="#c0392b", linestyle="--", linewidth=1, label=f"threshold: {100 * share:.1f} % kept")
    axes.set(
        ylim=(0, 1.02),
        xlabel=f"{score_name} score (higher: more like the training images)",
        ylabel="share of test images at or above",
        title="Test images against the threshold",
    )
    axes.legend(loc="lower left", fontsize=7)
    chart = html_page.image(_pixels(figure), "share of test images against the score")
    text = (
        f'Predict answers "unknown" for an image unlike the training images: its {score_name} score below '
        f"{threshold:.4g}, the threshold that keeps the configured share of all validation images. It keeps "
        f"{100 * share:.2f} % of these test images; the least like the training images come first below."
    )
    least = np.argsort(scores, kind="stable")[:count]
    pictures = ""
    if images is not None and len(least):
        in_file_order = np.sort(least)  # a memory map is read in file order
        chosen = np.asarray(images[in_file_order])[np.searchsorted(in_file_order, least)]
        cells = [
            f'<span class="unusual">{html_page.image(picture.transpose(1, 2, 0), paths[index])}'
            f"<br>{html_page.escape(paths[index])}<br>score {scores[index]:.4g}"
            f"{' (unknown)' if not inside[index] else ''}</span>"
            for picture, index in zip(chosen, least, strict=True)
        ]
        pictures = f'<div class="unusual-images">{"".join(cells)}</div>'
    headline = {"like the training images": f"{100 * share:.2f} % of the images (by {score_name})"}
    return headline, html_page.paragraph(text) + chart + pictures


@dataclass(frozen=True)
class LabelFigures:
    """One class's row of the multi-label table."""

    name: str
    average_precision: float
    precision: float
    recall: float
    f1: float
    threshold: float
    support: int


def label_figures(
    probabilities: np.ndarray, labels: np.ndarray, thresholds: np.ndarray, class_names: list[str]
) -> list[LabelFigures]:
    """Per class: AP (threshold-free), and precision, recall and F1 with the label given at its threshold."""
    ap = multilabel_average_precision(
        torch.from_numpy(probabilities), torch.from_numpy(labels.astype(np.int64)), len(class_names), average="none"
    )
    given, present = probabilities >= thresholds[None, :], labels.astype(bool)
    rows = []
    for k, name in enumerate(class_names):
        hits, claimed, support = (
            int((given[:, k] & present[:, k]).sum()),
            int(given[:, k].sum()),
            int(present[:, k].sum()),
        )
        precision = hits / claimed if claimed else 0.0
        recall = hits / support if support else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        ap_k = float(ap[k]) if support else float("nan")
        rows.append(LabelFigures(name, ap_k, precision, recall, f1, float(thresholds[k]), support))
    return rows


def wrong_labels(probabilities: np.ndarray, labels: np.ndarray, thresholds: np.ndarray, count: int) -> list[tuple]:
    """The ``count`` most confident wrong labels: (image, class, "given"/"missed", p), most confident first.

    A label given to an image without it counts by its probability; a label missed by how far below
    certainty it was (1 - p).
    """
    given, present = probabilities >= thresholds[None, :], labels.astype(bool)
    wrong = np.argwhere(given != present)
    confidence = np.where(
        given[wrong[:, 0], wrong[:, 1]],
        probabilities[wrong[:, 0], wrong[:, 1]],
        1 - probabilities[wrong[:, 0], wrong[:, 1]],
    )
    order = np.argsort(-confidence, kind="stable")[:count]
    return [(int(i), int(k), "given" if given[i, k] else "missed", float(probabilities[i, k])) for i, k in wrong[order]]


def multilabel_summary(
    figures: list[LabelFigures], probabilities: np.ndarray, labels: np.ndarray, thresholds: np.ndarray
) -> dict[str, str]:
    """mAP over the classes with images, and micro/macro F1 with each class at its threshold."""
    given, present = probabilities >= thresholds[None, :], labels.astype(bool)
    hits, claimed, support = (given & present).sum(), given.sum(), present.sum()
    micro = 2 * hits / (claimed + support) if claimed + support else 0.0
    scored = [row.average_precision for row in figures if row.support]
    return {
        "mAP": f"{100 * float(np.mean(scored)):.2f} %" if scored else "-",
        "F1 at the thresholds": f"macro {100 * np.mean([r.f1 for r in figures]):.2f} %, micro {100 * micro:.2f} %",
        "labels per image": f"{given.sum(axis=1).mean():.1f} given, {present.sum(axis=1).mean():.1f} true",
    }


def label_table(figures: list[LabelFigures]) -> str:
    worst_first = sorted(figures, key=lambda row: (np.nan_to_num(row.average_precision, nan=-1), row.name))
    return html_page.table(
        ["class", "AP", "precision", "recall", "F1", "threshold", "images with it"],
        [
            (
                row.name,
                "-" if np.isnan(row.average_precision) else f"{row.average_precision:.3f}",
                f"{row.precision:.3f}",
                f"{row.recall:.3f}",
                f"{row.f1:.3f}",
                f"{row.threshold:.3f}",
                row.support,
            )
            for row in worst_first
        ],
    )


def write_label_figures(path: Path, figures: list[LabelFigures]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["class", "average_precision", "precision", "recall", "f1", "threshold", "support"])
        writer.writerows(
            [
                [
                    r.name,
                    f"{r.average_precision:.4f}",
                    f"{r.precision:.4f}",
                    f"{r.recall:.4f}",
                    f"{r.f1:.4f}",
                    f"{r.threshold:.4f}",
                    r.support,
                ]
                for r in figures
            ]
        )


def write_wrong_labels(
    path: Path, wrong: list[tuple], labels: np.ndarray, thresholds: np.ndarray, class_names: list[str], paths: list[str]
) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["rank", "image", "label", "wrong", "p", "threshold", "true_labels"])
        for rank, (image, k, kind, p) in enumerate(wrong, start=1):
            true = " ".join(class_names[j] for j in np.flatnonzero(labels[image]))
            writer.writerow([rank, paths[image], class_names[k], kind, f"{p:.4f}", f"{thresholds[k]:.4f}", true])


def label_page(
    headline: dict,
    figures: list[LabelFigures],
    extra: list[tuple[str, str]],
    wrong: list[tuple],
    gallery: list,
    labels: np.ndarray,
    thresholds: np.ndarray,
    class_names: list[str],
    paths: list[str],
    note: str,
) -> str:
    """The multi-label report as one HTML document (``extra``: the calibration section, after the table)."""
    pictures = []
    for (seen, overlay), (image, k, kind, p) in zip(gallery, wrong, strict=False):
        shown = [html_page.image(seen, "as the network saw it")]
        if overlay is not None:
            shown.append(html_page.image(overlay, f"where it looked for {class_names[k]}"))
        true = " ".join(class_names[j] for j in np.flatnonzero(labels[image])) or "(none)"
        pictures.append(
            html_page.figure(
                shown,
                [
                    f"{kind}: {class_names[k]} (p = {p:.3f}, threshold {thresholds[k]:.3f})",
                    f"true: {true}",
                    paths[image],
                ],
            )
        )
    body = f'<div class="gallery">{"".join(pictures)}</div>' if pictures else html_page.paragraph("No wrong labels.")
    if wrong and not pictures:
        rows = [(paths[i], class_names[k], kind, f"{p:.3f}", f"{thresholds[k]:.3f}") for i, k, kind, p in wrong]
        body = html_page.table(["image", "label", "wrong", "p", "threshold"], rows)
    if note:
        body = html_page.paragraph(note, note=True) + body
    sections = [
        ("Summary", html_page.table(None, list(headline.items()), text_columns=2)),
        (
            "Per class (worst AP first; precision, recall and F1 with the label given at its threshold)",
            label_table(figures),
        ),
        *extra,
        (f"The {len(wrong)} most confident wrong labels (given to an image without it, or missed)", body),
    ]
    return html_page.page("Evaluation report", sections)
