"""The validation confusion matrix, as a figure with class names, and per-class accuracy."""

from __future__ import annotations

from typing import Any

import lightning as L
import matplotlib

matplotlib.use("Agg")  # draw into images only; never open a window

import matplotlib.pyplot as plt
from torchmetrics.classification import MulticlassConfusionMatrix
from typing_extensions import override

from ..foundation.logging_steps import metrics_step
from .tensorboard import tensorboard_writers

# Drawn this wide (px), it shows at TensorBoard's default card size without being scaled down.
FIGURE_PIXELS = 400
DPI = 100
# Up to this many classes each cell carries its value and the axes carry every class name.
ANNOTATED_CLASSES = 20


class ConfusionMatrix(L.Callback):
    """Log ``val/confusion_matrix`` (figure) and ``val_class_top1/<class>`` after each validation.

    The figure is 400 px wide, so TensorBoard shows it unscaled: rows normalised per true class
    with a colour scale and, up to 20 classes, each cell's value and every class name. Both are
    logged at the step of the ``val/*`` scalars of the same validation. The metric is a
    torchmetrics object, so under DDP it is summed over every rank's shard before anything is drawn.
    """

    def __init__(self, normalize: bool = True, max_named_classes: int = 100) -> None:
        """Configure the figure.

        Args:
            normalize: Show each true class's row as fractions rather than counts.
            max_named_classes: Write class names on the axes up to this many classes.
        """
        self.normalize = normalize
        self.max_named_classes = max_named_classes
        self.metric: MulticlassConfusionMatrix | None = None

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # Several labels per image have no single confusion: the report's per-class AP covers them.
        multilabel = pl_module.multilabel
        self.metric = None if multilabel else MulticlassConfusionMatrix(len(pl_module.class_names)).to(pl_module.device)

    @override
    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if trainer.sanity_checking or outputs is None or self.metric is None:
            return
        self.metric.to(outputs.device).update(outputs.argmax(dim=-1), batch[1])

    @override
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or self.metric is None:
            return
        matrix = self.metric.compute()  # synchronized over ranks
        self.metric.reset()
        if not trainer.is_global_zero:
            return
        class_names = list(pl_module.class_names)
        correct = matrix.diag().float()
        totals = matrix.sum(dim=1).float().clamp(min=1)
        per_class = {
            f"val_class_top1/{name}": float(acc) for name, acc in zip(class_names, correct / totals, strict=True)
        }
        step = metrics_step(trainer)
        for logger in trainer.loggers:
            logger.log_metrics(per_class, step=step)
        writers = tensorboard_writers(trainer, self, "confusion matrices")
        if not writers:
            return
        figure = self._draw(matrix, class_names)
        for writer in writers:
            writer.add_figure("val/confusion_matrix", figure, step, close=False)
        plt.close(figure)

    def _draw(self, matrix, class_names: list[str]):
        values = matrix.float().cpu()
        if self.normalize:
            values = values / values.sum(dim=1, keepdim=True).clamp(min=1)
        count = len(class_names)
        annotated = count <= ANNOTATED_CLASSES
        pixels = FIGURE_PIXELS if annotated else min(FIGURE_PIXELS + 8 * count, 1600)
        figure, axes = plt.subplots(figsize=(pixels / DPI, pixels / DPI), dpi=DPI)
        image = axes.imshow(values.numpy(), cmap="Blues", vmin=0, vmax=1.0 if self.normalize else None)
        colorbar = figure.colorbar(image, ax=axes, fraction=0.046, pad=0.03)
        colorbar.ax.tick_params(labelsize=6)
        if annotated:
            dark = 0.6 * float(values.max())
            for row, cells in enumerate(values.tolist()):
                for column, value in enumerate(cells):
                    text = f"{value:.2f}".removeprefix("0") if self.normalize else f"{value:.0f}"
                    colour = "white" if value > dark else "black"
                    axes.text(column, row, text, ha="center", va="center", fontsize=6.5, color=colour)
        if count <= self.max_named_classes:
            ticks = range(count)
            fontsize = 8 if annotated else 4
            axes.set_xticks(ticks, class_names, rotation=60, ha="right", rotation_mode="anchor", fontsize=fontsize)
            axes.set_yticks(ticks, class_names, fontsize=fontsize)
        axes.set_xlabel("predicted", fontsize=8)
        axes.set_ylabel("true", fontsize=8)
        axes.set_title("share of each true class" if self.normalize else "images", fontsize=8)
        figure.tight_layout(pad=0.3)
        return figure
