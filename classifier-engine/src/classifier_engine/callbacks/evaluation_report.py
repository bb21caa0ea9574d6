"""``test`` writes ``report.html`` beside its logs: per-class figures, confusion matrix, most confident mistakes."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor
from torchvision.utils import make_grid
from typing_extensions import override

from ..data.interfaces import HeldOutImages
from ..foundation import html_page
from ..foundation.files import Partial
from ..models.class_activation import activation_layer, class_activation_maps, overlaid
from ..models.labels import is_imbalanced
from ..models.network_parts import inference_batch
from .label_report import (
    calibration_section,
    coverage_section,
    label_figures,
    label_page,
    multilabel_summary,
    unusual_section,
    write_label_figures,
    write_wrong_labels,
    wrong_labels,
)
from .report_tables import ClassFigures, confident_mistakes, confusion_counts, per_class, top_k_accuracy
from .tensorboard import tensorboard_writers

SHOWN_CONFUSION_CLASSES = 40  # a larger matrix is unreadable as a table; per_class.csv still has every class


@dataclass(frozen=True)
class Answers:
    """The model's answers to the test images: probabilities before and after calibration, and its thresholds."""

    plain: np.ndarray
    calibrated: np.ndarray
    temperature: list[float]
    multilabel: bool
    thresholds: np.ndarray | None = None  # multi-label: each class's
    scores: np.ndarray | None = None  # multi-class with rejection: each image's score
    rejection: float | None = None  # ... and the threshold below which the answer is "unknown"
    score_name: str = ""
    domain_scores: np.ndarray | None = None  # each image's "like the training images" score, where there is one
    domain_threshold: float | None = None
    domain_name: str = ""

    @classmethod
    def of(
        cls, model: L.LightningModule, logits: np.ndarray, multilabel: bool, features: Tensor | None = None
    ) -> Answers:
        raw = torch.from_numpy(logits)
        plain = (raw.sigmoid() if multilabel else raw.softmax(dim=-1)).numpy()
        calibration = getattr(model, "calibration", None)
        if calibration is None:  # a model without one: its probabilities as they are
            thresholds = np.full(logits.shape[1], 0.5, np.float32) if multilabel else None
            return cls(plain, plain, [1.0], multilabel, thresholds)
        with torch.no_grad():
            on_device = raw.to(calibration.temperature.device)
            calibrated = calibration.probabilities(on_device).cpu().numpy()
            temperature = calibration.temperature.cpu().tolist()
            domain = calibration.domain_scores(on_device, None if features is None else features.to(on_device.device))
            threshold = float(calibration.domain_threshold)
            unlike = {}
            if domain is not None and math.isfinite(threshold):
                unlike = {
                    "domain_scores": domain.cpu().numpy(),
                    "domain_threshold": threshold,
                    "domain_name": calibration.reject_with,
                }
            if multilabel:
                return cls(plain, calibrated, temperature, True, calibration.thresholds.cpu().numpy(), **unlike)
            rejection = float(calibration.rejection)
            if not math.isfinite(rejection):
                return cls(plain, calibrated, temperature, False, **unlike)
            scores = calibration.scores(on_device, "msp").cpu().numpy()
        return cls(plain, calibrated, temperature, False, None, scores, rejection, "top probability", **unlike)

    def sections(
        self, labels: np.ndarray, headline: dict, images: Any = None, paths: list[str] | None = None
    ) -> list[tuple[str, str]]:
        """The calibration section, the coverage one (with a likely-mistake threshold) and the images least like
        the training ones (with a domain score); their figures join ``headline``."""
        added, body = calibration_section(self.plain, self.calibrated, labels, self.temperature, self.multilabel)
        headline |= added
        sections = [("Calibration: reliability before and after temperature scaling", body)]
        if self.scores is not None:
            correct = self.calibrated.argmax(axis=1) == labels
            added, body = coverage_section(self.scores, correct, self.rejection, self.score_name)
            headline |= added
            sections.append(('"Unknown" answers: accuracy against coverage', body))
        if self.domain_scores is not None:
            names = paths or [str(index) for index in range(len(self.domain_scores))]
            added, body = unusual_section(self.domain_scores, self.domain_threshold, self.domain_name, images, names)
            headline |= added
            sections.append(('"Unknown": the test images least like the training ones', body))
        return sections


class EvaluationReport(L.Callback):
    """After ``test``: ``report.html``, ``per_class.csv`` and ``mistakes.csv`` in the test run's folder.

    The page is one file with its images embedded: the headline figures; per class its precision,
    recall, F1, support and the class it is most often taken for; the confusion matrix; calibration
    before and after temperature scaling (ECE, reliability diagrams) and accuracy against coverage
    (the "unknown" threshold marked); and the
    ``mistakes`` wrong answers given with the highest probability, each as the network saw it, beside
    a Grad-CAM map of where it looked for the class it chose (``models/class_activation.py``), with
    the true and predicted class, their probabilities and the image's file. The gallery and the
    per-class table also go to TensorBoard. The images come from the DataModule's ``held_out_images``
    (the split ``test`` reads); under DDP the ranks' shares are gathered first. Every file is written
    whole or not at all, and a failed evaluation writes none. The probabilities are the model's
    calibrated ones (its ``calibration``, when it has one). For a multi-label model the page has per
    class its AP, and its precision, recall and F1 at its threshold; calibration per class; and the most
    confident wrong labels (given to an image without it, or missed).
    """

    def __init__(self, mistakes: int = 24, overlays: bool = True) -> None:
        """Configure the report.

        Args:
            mistakes: How many of the most confident mistakes the gallery shows.
            overlays: Draw where the network looked (Grad-CAM) beside each mistake.
        """
        self.mistakes = mistakes
        self.overlays = overlays
        self.logits: list[np.ndarray] = []
        self.labels: list[np.ndarray] = []
        self.path: Path | None = None

    @override
    def on_test_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.logits, self.labels = [], []

    @override
    def on_test_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self.logits.append(outputs.float().cpu().numpy())
        self.labels.append(batch[1].cpu().numpy())

    @override
    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        logits, labels = self._gathered(trainer)
        folder = Path(trainer.log_dir or trainer.default_root_dir)  # a collective call: every rank makes it
        if not trainer.is_global_zero or not len(labels):
            return
        folder.mkdir(parents=True, exist_ok=True)
        class_names = [str(name) for name in getattr(pl_module, "class_names", None) or range(logits.shape[1])]
        held_out, why_no_images = self._images(trainer, labels)
        features = self._features(pl_module, held_out) if held_out is not None else None
        answers = Answers.of(pl_module, logits, labels.ndim == 2, features)
        names = held_out.names if held_out is not None else [str(index) for index in range(len(labels))]
        root = getattr(trainer.datamodule, "image_root", None)
        paths = [str(Path(root, name)) if root and held_out is not None else name for name in names]
        source = {
            "split": held_out.split if held_out is not None else "test",
            "data": held_out.dataset if held_out is not None else type(trainer.datamodule).__name__,
            "checkpoint": str(trainer.ckpt_path or "the model as it is"),
        }
        report = self._multilabel_report if labels.ndim == 2 else self._single_label_report
        page, table, gallery = report(
            trainer, pl_module, folder, answers, labels, class_names, held_out, paths, source, why_no_images
        )
        with Partial(folder / "report.html") as path:
            path.write_text(page, encoding="utf-8")
        self.path = folder / "report.html"
        self._to_tensorboard(trainer, table, gallery)  # main.py's closing lines name the report

    def _single_label_report(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        folder: Path,
        answers: Answers,
        labels: np.ndarray,
        class_names: list[str],
        held_out: HeldOutImages | None,
        paths: list[str],
        source: dict[str, str],
        why_no_images: str,
    ) -> tuple[str, list[str], list]:
        """The page, the per-class table for TensorBoard (markdown rows) and the gallery of one-label answers."""
        probabilities = answers.calibrated
        predicted = probabilities.argmax(axis=1)
        confusion = confusion_counts(labels, predicted, len(class_names))
        classes = per_class(confusion, class_names)
        shown = confident_mistakes(probabilities, labels, self.mistakes)
        gallery, why_no_overlays = self._gallery(pl_module, held_out, shown, predicted[shown])
        with Partial(folder / "per_class.csv") as path:
            write_per_class(path, classes)
        with Partial(folder / "mistakes.csv") as path:
            write_mistakes(path, shown, labels, predicted, probabilities, class_names, paths)
        headline = {
            "images": len(labels),
            "top-1": f"{100 * top_k_accuracy(probabilities, labels, 1):.2f} %",
            "top-5": f"{100 * top_k_accuracy(probabilities, labels, 5):.2f} %",
        }
        if is_imbalanced(pl_module.hparams.get("class_counts")) or is_imbalanced([c.support for c in classes]):
            headline["balanced accuracy"] = f"{100 * np.mean([c.recall for c in classes]):.2f} %"
            headline["macro-F1"] = f"{100 * np.mean([c.f1 for c in classes]):.2f} %"
        extra = answers.sections(labels, headline, held_out.images if held_out is not None else None, paths)
        page = report_page(
            headline | source,
            classes,
            confusion,
            class_names,
            shown,
            labels,
            predicted,
            probabilities,
            paths,
            gallery,
            why_no_images or why_no_overlays,
            extra,
        )
        table = ["| class | precision | recall | F1 | support | most confused with |", "|---|---|---|---|---|---|"]
        table += [
            f"| {c.name} | {c.precision:.3f} | {c.recall:.3f} | {c.f1:.3f} | {c.support} | {c.confused_with} |"
            for c in classes
        ]
        return page, table, gallery

    def _multilabel_report(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        folder: Path,
        answers: Answers,
        labels: np.ndarray,
        class_names: list[str],
        held_out: HeldOutImages | None,
        paths: list[str],
        source: dict[str, str],
        why_no_images: str,
    ) -> tuple[str, list[str], list]:
        """The same for several labels per image: AP and each class's threshold, the most confident wrong labels."""
        probabilities, thresholds = answers.calibrated, answers.thresholds
        figures = label_figures(probabilities, labels, thresholds, class_names)
        headline = {"images": len(labels), **multilabel_summary(figures, probabilities, labels, thresholds)}
        extra = answers.sections(labels, headline, held_out.images if held_out is not None else None, paths)
        wrong = wrong_labels(probabilities, labels, thresholds, self.mistakes)
        shown = np.asarray([image for image, *_ in wrong], dtype=np.int64)
        gallery, why_no_overlays = self._gallery(pl_module, held_out, shown, np.asarray([k for _, k, *_ in wrong]))
        with Partial(folder / "per_class.csv") as path:
            write_label_figures(path, figures)
        with Partial(folder / "mistakes.csv") as path:
            write_wrong_labels(path, wrong, labels, thresholds, class_names, paths)
        page = label_page(
            headline | source,
            figures,
            extra,
            wrong,
            gallery,
            labels,
            thresholds,
            class_names,
            paths,
            why_no_images or why_no_overlays,
        )
        table = ["| class | AP | precision | recall | F1 | threshold | support |", "|---|---|---|---|---|---|---|"]
        table += [
            f"| {r.name} | {r.average_precision:.3f} | {r.precision:.3f} | {r.recall:.3f} | {r.f1:.3f} | "
            f"{r.threshold:.3f} | {r.support} |"
            for r in figures
        ]
        return page, table, gallery

    def _gathered(self, trainer: L.Trainer) -> tuple[np.ndarray, np.ndarray]:
        """Every rank's logits and labels, in the split's order, on rank 0 (others get what they hold)."""
        probabilities = np.concatenate(self.logits) if self.logits else np.zeros((0, 1), np.float32)
        labels = np.concatenate(self.labels) if self.labels else np.zeros(0, np.int64)
        if trainer.world_size == 1 or not dist.is_initialized():
            return probabilities, labels
        shares: list[Any] = [None] * trainer.world_size
        dist.all_gather_object(shares, (probabilities, labels))
        # The test sampler deals the split round-robin (UnrepeatedDistributedSampler): image i is on rank i % W.
        total, world = sum(len(share[1]) for share in shares), trainer.world_size
        order = np.concatenate([np.arange(rank, total, world) for rank in range(world)])
        gathered_p = np.empty((total, probabilities.shape[1]), np.float32)
        gathered_l = np.empty((total, *labels.shape[1:]), labels.dtype)
        gathered_p[order] = np.concatenate([share[0] for share in shares])
        gathered_l[order] = np.concatenate([share[1] for share in shares])
        return gathered_p, gathered_l

    @staticmethod
    def _features(pl_module: Any, held_out: HeldOutImages) -> Tensor | None:
        """The contract's ``features()`` of the held-out images, for the knn score (one pass, no gradients)."""
        if getattr(getattr(pl_module, "calibration", None), "reject_with", "none") != "knn":
            return None
        chunks, batch_size = [], inference_batch(pl_module.device)
        with torch.no_grad():
            for start in range(0, len(held_out.labels), batch_size):
                images = torch.as_tensor(np.asarray(held_out.images[start : start + batch_size]))
                chunks.append(pl_module.features(images.to(pl_module.device)).float().cpu())
        return torch.cat(chunks) if chunks else None

    @staticmethod
    def _images(trainer: L.Trainer, labels: np.ndarray) -> tuple[HeldOutImages | None, str]:
        data = trainer.datamodule
        if not callable(getattr(data, "held_out_images", None)):
            return None, f"no pictures: {type(data).__name__} does not hand out its images (held_out_images)"
        held_out = data.held_out_images()
        if not np.array_equal(np.asarray(held_out.labels), labels):
            return None, "no pictures: the DataModule's held-out images are not the ones test read"
        return held_out, ""

    def _gallery(
        self, pl_module: L.LightningModule, held_out: HeldOutImages | None, shown: np.ndarray, looked_for: np.ndarray
    ) -> tuple[list[tuple[np.ndarray, np.ndarray | None]], str]:
        """(image as seen (S, S, 3), overlay or None) per image shown (where it looked for the class in
        ``looked_for``), and why there are no overlays, if so."""
        if held_out is None or not len(shown):
            return [], ""
        in_file_order = np.sort(shown)  # a memory map is read in file order, then put back in rank order
        images = np.asarray(held_out.images[in_file_order])[np.searchsorted(in_file_order, shown)]
        seen = images.transpose(0, 2, 3, 1)
        if not self.overlays:
            return [(image, None) for image in seen], "overlays are off (EvaluationReport.overlays)"
        layer, name_or_reason = activation_layer(pl_module.backbone, int(pl_module.image_size))
        if layer is None:
            return [(image, None) for image in seen], f"no overlays: {name_or_reason}"
        network = pl_module.network().eval()
        maps = class_activation_maps(network, layer, images, looked_for)
        return list(zip(seen, overlaid(images, maps), strict=True)), ""

    @staticmethod
    def _to_tensorboard(trainer: L.Trainer, table: list[str], gallery: list) -> None:
        writers = tensorboard_writers(trainer, EvaluationReport, "the report's gallery and table")
        pictures = [
            torch.from_numpy(np.ascontiguousarray(picture)).permute(2, 0, 1)
            for pair in gallery
            for picture in pair
            if picture is not None
        ]
        for writer in writers:
            writer.add_text("test/per_class", "\n".join(table), trainer.global_step)
            if pictures:
                per_row = 2 if gallery[0][1] is not None else 1
                grid = make_grid(pictures, nrow=8 * per_row, padding=2)
                writer.add_image("test/confident_mistakes", grid, trainer.global_step)
            writer.flush()


def write_per_class(path: Path, classes: list[ClassFigures]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["class", "precision", "recall", "f1", "support", "most_confused_with", "confused_share"])
        for c in classes:
            writer.writerow(
                [
                    c.name,
                    f"{c.precision:.4f}",
                    f"{c.recall:.4f}",
                    f"{c.f1:.4f}",
                    c.support,
                    c.confused_with,
                    f"{c.confused_share:.4f}",
                ]
            )


def write_mistakes(path: Path, shown, labels, predicted, probabilities, class_names, paths) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["rank", "image", "true", "predicted", "p_predicted", "p_true"])
        for rank, index in enumerate(shown, start=1):
            writer.writerow(
                [
                    rank,
                    paths[index],
                    class_names[labels[index]],
                    class_names[predicted[index]],
                    f"{probabilities[index, predicted[index]]:.4f}",
                    f"{probabilities[index, labels[index]]:.4f}",
                ]
            )


def report_page(
    headline, classes, confusion, class_names, shown, labels, predicted, probabilities, paths, gallery, note, extra=()
) -> str:
    """The report as one HTML document (``extra``: sections after the confusion matrix)."""
    sections = [("Summary", html_page.table(None, list(headline.items()), text_columns=2))]
    worst_first = sorted(classes, key=lambda c: (c.f1, c.name))
    sections.append(
        (
            "Per class (worst F1 first)",
            html_page.table(
                ["class", "precision", "recall", "F1", "support", "most confused with", "share"],
                [
                    (
                        c.name,
                        f"{c.precision:.3f}",
                        f"{c.recall:.3f}",
                        f"{c.f1:.3f}",
                        c.support,
                        c.confused_with or "-",
                        f"{100 * c.confused_share:.1f} %",
                    )
                    for c in worst_first
                ],
            ),
        )
    )
    if len(class_names) <= SHOWN_CONFUSION_CLASSES:
        share = confusion / np.maximum(confusion.sum(axis=1, keepdims=True), 1)
        rows = [(str(name), *confusion[k].tolist()) for k, name in enumerate(class_names)]
        matrix = html_page.table(["true \\ predicted", *map(str, class_names)], rows, shades=share)
    else:
        matrix = html_page.paragraph(f"{len(class_names)} classes: too many to show; see per_class.csv.", note=True)
    sections.append(("Confusion matrix (rows: true class, shaded by share of the row)", matrix))
    sections += list(extra)
    figures = []
    for (seen, overlay), index in zip(gallery, shown, strict=False):
        pictures = [html_page.image(seen, "as the network saw it")]
        if overlay is not None:
            pictures.append(html_page.image(overlay, "where it looked"))
        figures.append(
            html_page.figure(
                pictures,
                [
                    f"true: {class_names[labels[index]]} (p = {probabilities[index, labels[index]]:.3f})",
                    f"predicted: {class_names[predicted[index]]} (p = {probabilities[index, predicted[index]]:.3f})",
                    paths[index],
                ],
            )
        )
    body = f'<div class="gallery">{"".join(figures)}</div>' if figures else ""
    if not len(shown):
        body = html_page.paragraph("No mistakes.")
    elif not figures:
        body = html_page.table(
            ["image", "true", "predicted", "p"],
            [
                (paths[i], class_names[labels[i]], class_names[predicted[i]], f"{probabilities[i, predicted[i]]:.3f}")
                for i in shown
            ],
        )
    if note:
        body = html_page.paragraph(note, note=True) + body
    title = f"The {len(shown)} most confident mistakes (left: the image as seen; right: where it looked)"
    sections.append((title if len(shown) else "Mistakes", body))
    return html_page.page("Evaluation report", sections)
