"""The LightningModule: uint8 images in, logits out, one metric collection per stage."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal, get_args

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor, nn
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from ..data.interfaces import TrainingImages
from .backbones import BackboneName, PatchWhitening, build_backbone
from .schedules import Replanned, ScheduleName, build_schedule

TestTimeAugmentation = Literal["none", "flip", "flip_translate"]
ValidationViews = Literal["final", "every"]
NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


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
        lr_schedule: ScheduleName = "onecycle",
        warmup_fraction: float = 0.2,
        lr_start_factor: float = 0.2,
        lr_end_factor: float = 0.07,
        norm_bias_lr_scale: float = 1.0,
        test_time_augmentation: TestTimeAugmentation = "none",
        tta_validations: ValidationViews = "final",
        whitening_images: int = 5000,
        whitening_bias_epochs: int = 3,
        channels_last: bool = False,
        compile: bool = False,
        compile_mode: str | None = None,
        compile_backend: str = "inductor",
    ) -> None:
        """Build the network and its metrics.

        Args:
            num_classes: Number of classes (linked from the data).
            class_names: Class names, stored in checkpoints (linked from the data).
            mean: Per-channel mean of the data in [0, 1] (linked from the data).
            std: Per-channel standard deviation of the data in [0, 1] (linked from the data).
            backbone: Network architecture: fastcnn, airbench, resnet18, resnet34 or resnet50.
            width: Channels of the first group of fastcnn/airbench (the later groups have 4x); ResNets need 64.
            label_smoothing: Label smoothing of the cross-entropy loss.
            optimizer: Optimizer class and arguments; defaults to SGD(lr=0.1, momentum=0.9, nesterov, wd=5e-4).
            lr_schedule: Per-step learning-rate schedule over the whole run: onecycle, warmup_cosine,
                triangle (linear up from lr_start_factor, then linear down to lr_end_factor) or constant;
                an extended run re-plans it over its new length (see schedules.py).
            warmup_fraction: Fraction of all optimizer steps spent warming up (onecycle, warmup_cosine, triangle).
            lr_start_factor: First step's learning rate as a fraction of the peak (triangle).
            lr_end_factor: Last step's learning rate as a fraction of the peak (triangle).
            norm_bias_lr_scale: Learning-rate multiplier for BatchNorm shifts; their weight decay is divided
                by it, so the decay per step is unchanged (airbench uses 64).
            test_time_augmentation: Views averaged at validation/test/predict: none, flip (and its mirror),
                or flip_translate (also two 1-pixel shifts, six views in all).
            tta_validations: Which validations during fit average those views: final (the last one; the
                others see one view, which is cheaper) or every one. validate/test/predict always do.
            whitening_images: Training images the airbench backbone's whitening layer is fitted to at fit start.
            whitening_bias_epochs: Epochs during which the airbench whitening layer's bias trains.
            channels_last: Keep activations and weights in NHWC memory order (faster convolutions on GPUs).
            compile: Compile the backbone with torch.compile (minutes of compiling before the first step).
            compile_mode: torch.compile mode (inductor): default, reduce-overhead or max-autotune.
            compile_backend: torch.compile backend: inductor (generates kernels), or e.g. aot_eager to debug.
        """
        super().__init__()
        self.save_hyperparameters()
        if not 0.0 <= warmup_fraction < 1.0:
            raise ValueError(f"model.warmup_fraction must be in [0, 1), got {warmup_fraction}")
        if norm_bias_lr_scale <= 0:
            raise ValueError(f"model.norm_bias_lr_scale must be positive, got {norm_bias_lr_scale}")
        if whitening_images < 1:
            raise ValueError(f"model.whitening_images must be a positive integer, got {whitening_images}")
        for name, value, allowed in (
            ("test_time_augmentation", test_time_augmentation, TestTimeAugmentation),
            ("tta_validations", tta_validations, ValidationViews),
        ):
            if value not in get_args(allowed):
                raise ValueError(f"model.{name} must be one of {', '.join(get_args(allowed))}, got {value!r}")
        self.class_names = list(class_names) if class_names else [str(i) for i in range(num_classes)]
        if len(self.class_names) != num_classes:
            raise ValueError(f"{len(self.class_names)} class names given for {num_classes} classes")
        self.optimizer_factory = optimizer
        self.normalize = Normalize(mean, std)
        self.backbone = build_backbone(backbone, num_classes, width)
        # Layers fitted to data rather than trained (airbench's whitening); a plain tuple, not submodules.
        self.whitening_layers = tuple(
            module for module in self.backbone.modules() if isinstance(module, PatchWhitening)
        )
        if channels_last:
            self.backbone.to(memory_format=torch.channels_last)
        self.compiled_backbone: Callable[[Tensor], Tensor] | None = None
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
        return self._backbone(self._normalized(images))

    def evaluate(self, images: Tensor, views: TestTimeAugmentation | None = None) -> Tensor:
        """Logits averaged over the test-time ``views`` (airbench's TTA; default: the configured ones)."""
        views = views or self.hparams.test_time_augmentation
        x = self._normalized(images)
        if views == "none":
            return self._backbone(x)
        logits = self._with_mirror(x)
        if views == "flip_translate":
            height, width = x.shape[-2:]
            padded = F.pad(x, (1, 1, 1, 1), mode="reflect")
            shifted = (padded[..., :height, :width], padded[..., 2:, 2:])
            logits = 0.5 * logits + 0.5 * torch.stack([self._with_mirror(view) for view in shifted]).mean(0)
        return logits

    def _evaluation_views(self) -> TestTimeAugmentation:
        """The configured views, except at a validation during fit that is not the last (with "final")."""
        trainer = self.trainer
        if self.hparams.tta_validations == "every" or trainer.state.fn != "fit":
            return self.hparams.test_time_augmentation
        last_step = trainer.max_steps is not None and 0 < trainer.max_steps <= trainer.global_step
        last_epoch = trainer.max_epochs is not None and trainer.current_epoch >= trainer.max_epochs - 1
        return self.hparams.test_time_augmentation if last_step or last_epoch else "none"

    def _with_mirror(self, x: Tensor) -> Tensor:
        return 0.5 * self._backbone(x) + 0.5 * self._backbone(x.flip(-1))

    def _normalized(self, images: Tensor) -> Tensor:
        x = self.normalize(images)
        return x.contiguous(memory_format=torch.channels_last) if self.hparams.channels_last else x

    def _backbone(self, x: Tensor) -> Tensor:
        return self.compiled_backbone(x) if self.compiled_backbone is not None else self.backbone(x)

    def configure_model(self) -> None:
        # A compiled bound method rather than an OptimizedModule attribute: the state_dict keys,
        # network() (profiled, exported) and checkpoints stay those of the plain backbone.
        if self.hparams.compile and self.compiled_backbone is None:
            self.compiled_backbone = torch.compile(
                self.backbone.forward, mode=self.hparams.compile_mode, backend=self.hparams.compile_backend
            )

    def setup(self, stage: str) -> None:
        if stage == "fit":
            self._fit_whitening()

    def _fit_whitening(self) -> None:
        """Fit data-dependent layers to the training images (a resumed run then loads its own weights over them)."""
        if not self.whitening_layers:
            return
        datamodule = self.trainer.datamodule
        if not isinstance(datamodule, TrainingImages):
            raise ValueError(
                "the airbench backbone fits its whitening layer to training images and needs a DataModule "
                "offering them (data.interfaces.TrainingImages: train_images(count)), such as CifarDataModule"
            )
        images = self.normalize(datamodule.train_images(self.hparams.whitening_images).to(self.device))
        for layer in self.whitening_layers:
            layer.fit(images)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.current_epoch < self.hparams.whitening_bias_epochs:
            return
        for layer in self.whitening_layers:
            layer.bias.grad = None  # the optimizer skips parameters without a gradient

    def network(self) -> nn.Sequential:
        """The inference network alone (shared modules, no trainer attached): safe to copy and profile."""
        return nn.Sequential(self.normalize, self.backbone)

    def _shared_step(
        self, batch: tuple[Tensor, Tensor], metrics: MetricCollection, stage: str
    ) -> tuple[Tensor, Tensor]:
        images, labels = batch
        logits = self(images) if stage == "train" else self.evaluate(images, self._evaluation_views())
        loss = self.criterion(logits, labels)
        metrics.update(logits, labels)
        on_step = stage == "train"
        # No per-step value in the progress bar: Lightning reads those on the host after every batch,
        # which would make a GPU wait for each step. The step loss goes to the logger at its cadence.
        self.log(f"{stage}/loss", loss, on_step=on_step, on_epoch=True, prog_bar=not on_step, sync_dist=not on_step)
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
        return self.evaluate(batch[0]).softmax(dim=-1)

    def configure_optimizers(self):
        groups = self._parameter_groups()
        if self.optimizer_factory is not None:
            optimizer = self.optimizer_factory(groups)
        else:
            optimizer = torch.optim.SGD(groups, lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
        for group in optimizer.param_groups:
            scale = group.get("lr_scale", 1.0)
            group["lr"] *= scale
            if "weight_decay" in group:
                group["weight_decay"] /= scale
        # The schedule spans all optimizer steps of the run as the trainer counts them now.
        scheduler = build_schedule(
            self.hparams.lr_schedule,
            optimizer,
            int(self.trainer.estimated_stepping_batches),
            self.hparams.warmup_fraction,
            self.hparams.lr_start_factor,
            self.hparams.lr_end_factor,
        )
        # "name" is LearningRateMonitor's tag: train/lr (train/lr/pg1, ... with several parameter groups).
        schedule = {"scheduler": scheduler, "interval": "step", "name": "train/lr"}
        return {"optimizer": optimizer, "lr_scheduler": schedule}

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # A run that reaches max_steps inside an epoch would end without validating its final weights
        # (the last val/* would be the previous epoch's). Asking to stop makes Lightning validate now,
        # after every callback's batch end (Lookahead's last copy included); the checkpoints follow.
        max_steps = self.trainer.max_steps
        if max_steps is not None and 0 < max_steps <= self.trainer.global_step:
            self.trainer.should_stop = True

    def on_train_start(self) -> None:
        # A checkpoint without the schedule's step (e.g. one written by a run without a schedule)
        # still puts the schedule where the run is.
        scheduler = self.lr_schedulers()
        if isinstance(scheduler, Replanned) and scheduler.last_epoch != self.trainer.global_step:
            scheduler.resume_at(self.trainer.global_step)

    def _parameter_groups(self) -> Iterable[Tensor] | list[dict[str, Any]]:
        scale = self.hparams.norm_bias_lr_scale
        if scale == 1.0:
            return self.parameters()
        shifts = [module.bias for module in self.modules() if isinstance(module, NORMS) and module.bias is not None]
        scaled = {id(parameter) for parameter in shifts}
        others = [parameter for parameter in self.parameters() if id(parameter) not in scaled]
        return [{"params": others}, {"params": shifts, "lr_scale": scale}]
