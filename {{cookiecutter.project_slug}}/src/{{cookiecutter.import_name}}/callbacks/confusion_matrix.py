"""The validation confusion matrix, as a figure with class names, and per-class accuracy."""

from __future__ import annotations

from typing import Any

import lightning as L
import matplotlib

matplotlib.use("Agg")  # draw into images only; never open a window

import matplotlib.pyplot as plt
from torchmetrics.classification import MulticlassConfusionMatrix

from .tensorboard import tensorboard_writers


class ConfusionMatrix(L.Callback):
    """Log ``val/confusion_matrix`` (figure) and ``val_class_top1/<class>`` after each validation.

    The metric is a torchmetrics object, so under DDP it is summed over every rank's shard
    before anything is drawn.
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

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.metric = MulticlassConfusionMatrix(pl_module.hparams.num_classes).to(pl_module.device)

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if trainer.sanity_checking or outputs is None:
            return
        self.metric.to(outputs.device).update(outputs.argmax(dim=-1), batch[1])

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
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
        for logger in trainer.loggers:
            logger.log_metrics(per_class, step=trainer.global_step)
        writers = tensorboard_writers(trainer, self, "confusion matrices")
        if not writers:
            return
        figure = self._draw(matrix, class_names)
        for writer in writers:
            writer.add_figure("val/confusion_matrix", figure, trainer.global_step, close=False)
        plt.close(figure)

    def _draw(self, matrix, class_names: list[str]):
        values = matrix.float()
        if self.normalize:
            values = values / values.sum(dim=1, keepdim=True).clamp(min=1)
        size = min(4 + 0.35 * len(class_names), 24)
        figure, axes = plt.subplots(figsize=(size, size))
        axes.imshow(values.cpu().numpy(), cmap="Blues", vmin=0)
        if len(class_names) <= self.max_named_classes:
            ticks = range(len(class_names))
            fontsize = 8 if len(class_names) <= 20 else 5
            axes.set_xticks(ticks, class_names, rotation=90, fontsize=fontsize)
            axes.set_yticks(ticks, class_names, fontsize=fontsize)
        axes.set_xlabel("predicted")
        axes.set_ylabel("true")
        figure.tight_layout()
        return figure
