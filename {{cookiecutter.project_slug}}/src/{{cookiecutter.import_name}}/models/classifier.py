"""The LightningModule: uint8 images in, logits out, one metric collection per stage."""

from __future__ import annotations

from typing import Literal

import lightning as L
import torch
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor, nn
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, LRScheduler, OneCycleLR, SequentialLR
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from .backbones import BackboneName, build_backbone

Schedule = Literal["onecycle", "warmup_cosine", "constant"]


class Normalize(nn.Module):
    """uint8 (or [0, 255] float) images to standardized floats, inside the model.

    Keeping this in the model means the trained network, and anything exported from it,
    takes raw pixels: no deployment can forget or mis-copy the constants.
    """

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        super().__init__()
        self.register_buffer("scale", 1.0 / (255.0 * torch.tensor(std).view(1, -1, 1, 1)))
        self.register_buffer("shift", torch.tensor(mean).view(1, -1, 1, 1) / torch.tensor(std).view(1, -1, 1, 1))

    def forward(self, images: Tensor) -> Tensor:
        return images.float() * self.scale - self.shift


class ImageClassifier(L.LightningModule):
    """Trains any backbone from ``backbones.py`` with label-smoothed cross-entropy."""

    def __init__(
        self,
        num_classes: int = 10,
        class_names: list[str] | None = None,
        mean: tuple[float, float, float] = (0.5, 0.5, 0.5),
        std: tuple[float, float, float] = (0.25, 0.25, 0.25),
        backbone: BackboneName = "{{ cookiecutter.backbone }}",
        width: int = 64,
        label_smoothing: float = 0.1,
        optimizer: OptimizerCallable | None = None,
        lr_schedule: Schedule = "onecycle",
        warmup_fraction: float = 0.2,
    ) -> None:
        """Build the network and its metrics.

        Args:
            num_classes: Number of classes (linked from the data).
            class_names: Class names, stored in checkpoints (linked from the data).
            mean: Per-channel mean of the data in [0, 1] (linked from the data).
            std: Per-channel standard deviation of the data in [0, 1] (linked from the data).
            backbone: Network architecture: fastcnn, resnet18, resnet34 or resnet50.
            width: Channels of fastcnn's first group (the later groups have 4x); ResNets need 64.
            label_smoothing: Label smoothing of the cross-entropy loss.
            optimizer: Optimizer class and arguments; defaults to SGD(lr=0.1, momentum=0.9, nesterov, wd=5e-4).
            lr_schedule: Per-step learning-rate schedule over the whole run: onecycle, warmup_cosine or constant.
            warmup_fraction: Fraction of all optimizer steps spent warming up (onecycle and warmup_cosine).
        """
        super().__init__()
        self.save_hyperparameters()
        if not 0.0 <= warmup_fraction < 1.0:
            raise ValueError(f"model.warmup_fraction must be in [0, 1), got {warmup_fraction}")
        self.class_names = list(class_names) if class_names else [str(i) for i in range(num_classes)]
        if len(self.class_names) != num_classes:
            raise ValueError(f"{len(self.class_names)} class names given for {num_classes} classes")
        self.optimizer_factory = optimizer
        self.normalize = Normalize(mean, std)
        self.backbone = build_backbone(backbone, num_classes, width)
        self.criterion = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
        metrics = MetricCollection(
            {
                "top1": MulticlassAccuracy(num_classes, top_k=1, average="micro"),
                "top5": MulticlassAccuracy(num_classes, top_k=min(5, num_classes), average="micro"),
            }
        )
        self.train_metrics = metrics.clone(prefix="train/")
        self.val_metrics = metrics.clone(prefix="val/")
        self.test_metrics = metrics.clone(prefix="test/")
        self.example_input_array = torch.zeros(2, 3, 32, 32, dtype=torch.uint8)

    def forward(self, images: Tensor) -> Tensor:
        """Logits for a batch of uint8 images of shape (N, 3, 32, 32)."""
        return self.backbone(self.normalize(images))

    def network(self) -> nn.Sequential:
        """The inference network alone (shared modules, no trainer attached): safe to copy and profile."""
        return nn.Sequential(self.normalize, self.backbone)

    def _shared_step(
        self, batch: tuple[Tensor, Tensor], metrics: MetricCollection, stage: str
    ) -> tuple[Tensor, Tensor]:
        images, labels = batch
        logits = self(images)
        loss = self.criterion(logits, labels)
        metrics.update(logits, labels)
        on_step = stage == "train"
        self.log(f"{stage}/loss", loss, on_step=on_step, on_epoch=True, prog_bar=True, sync_dist=not on_step)
        self.log_dict(metrics, on_step=False, on_epoch=True, prog_bar=stage != "train")
        return loss, logits

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self._shared_step(batch, self.train_metrics, "train")[0]

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """Returns the logits, for callbacks such as the confusion matrix."""
        return self._shared_step(batch, self.val_metrics, "val")[1].detach()

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._shared_step(batch, self.test_metrics, "test")

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """Class probabilities for each image."""
        return self(batch[0]).softmax(dim=-1)

    def configure_optimizers(self):
        if self.optimizer_factory is not None:
            optimizer = self.optimizer_factory(self.parameters())
        else:
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
        scheduler = self._schedule(optimizer)
        if scheduler is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def _schedule(self, optimizer: torch.optim.Optimizer) -> LRScheduler | None:
        """The schedule over all optimizer steps of the run, counted by the trainer."""
        total_steps = int(self.trainer.estimated_stepping_batches)
        if self.hparams.lr_schedule == "constant" or total_steps < 3:
            return None  # a run of one or two steps has no schedule to follow
        warmup_steps = int(self.hparams.warmup_fraction * total_steps)
        if self.hparams.lr_schedule == "onecycle":
            # OneCycleLR needs at least two warm-up steps and one step after them.
            warmup_steps = min(max(warmup_steps, 2), total_steps - 1)
            peak = [group["lr"] for group in optimizer.param_groups]
            return OneCycleLR(optimizer, max_lr=peak, total_steps=total_steps, pct_start=warmup_steps / total_steps)
        if warmup_steps == 0:
            return CosineAnnealingLR(optimizer, T_max=total_steps)
        warmup = LinearLR(optimizer, start_factor=1.0 / warmup_steps, total_iters=warmup_steps)
        decay = CosineAnnealingLR(optimizer, T_max=total_steps - warmup_steps)
        return SequentialLR(optimizer, [warmup, decay], milestones=[warmup_steps])
