"""The LightningModule: uint8 images in, logits out, one metric collection per evaluation stage.

Training keeps device-side running sums instead (``training_totals.py``): its step is the hot path.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any

import lightning as L
import torch
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor, nn
from torchmetrics import MetricCollection
from typing_extensions import override

from classifier_engine.foundation.logging_steps import at_logging_step
from classifier_engine.models.calibration import CHECKPOINT_KEY, Calibration, RejectionScore
from classifier_engine.models.labels import (
    ClassWeights,
    LossFactory,
    Task,
    build_loss,
    evaluation_metrics,
    is_imbalanced,
    loss_weights,
)
from classifier_engine.models.training_totals import TrainingTotals

from .backbones import BackboneFactory, FastCNN, build_backbone, head_of
from .schedules import OneCycle, Replanned, ScheduleFactory
from .test_time import TestTimeAugmentation

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

    @override
    def forward(self, images: Tensor) -> Tensor:
        return images.float() * self.scale - self.shift


class ImageClassifier(L.LightningModule):
    """Trains any backbone on uint8 images, one label or a set of labels each; the recipe's parts are arguments.

    After each validation of ``fit`` it fits its calibration on the validation images (temperature,
    multi-label thresholds, the "unknown" threshold: ``classifier_engine.models.calibration``), which
    every checkpoint keeps and predict, test and export use.

    The network, the learning-rate schedule and the test-time augmentation are objects the config
    builds (``class_path``), as the optimizer is; what a recipe does to training beyond that is a
    callback (see ``configs/cifar10_fast.yaml``).
    """

    def __init__(
        self,
        num_classes: int = 10,
        class_names: list[str] | None = None,
        mean: tuple[float, float, float] = (0.5, 0.5, 0.5),
        std: tuple[float, float, float] = (0.25, 0.25, 0.25),
        image_size: int = 32,
        class_counts: list[int] | None = None,
        task: Task = "multiclass",
        images_counted: int | None = None,
        backbone: BackboneFactory | None = None,
        label_smoothing: float = 0.1,
        class_weights: ClassWeights = None,
        balanced_loss: bool = False,
        loss: LossFactory | None = None,
        reject_with: RejectionScore = "msp",
        keep_correct: float = 0.95,
        optimizer: OptimizerCallable | None = None,
        lr_schedule: ScheduleFactory | None = None,
        norm_bias_lr_scale: float = 1.0,
        backbone_lr_scale: float = 1.0,
        test_time_augmentation: TestTimeAugmentation | None = None,
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
            image_size: Side in pixels of the square images (linked from the data).
            class_counts: Training images per class, when the data knows them (linked from the data).
            task: multiclass (softmax, one label each) or multilabel (a sigmoid per class; linked from the data).
            images_counted: Training images class_counts counts (linked from the data; multi-label weights need it).
            backbone: The network: a class taking num_classes first (models/backbones.py: FastCNN, AirBench,
                CifarResNet; or your own nn.Module); defaults to FastCNN.
            label_smoothing: Label smoothing of the cross-entropy loss (multi-class).
            class_weights: Weight of each class in the loss: null (all 1), balanced (the inverse of each class's
                share of the training images; multi-label: negatives / positives, as pos_weight) or {class: weight}.
            balanced_loss: The same as class_weights: balanced (the name of releases before 1.2).
            loss: The training loss instead of the task's own (cross-entropy, or BCE with logits for multi-label),
                e.g. class_path: timm.loss.AsymmetricLossMultiLabel; called with the class weights, if any.
            reject_with: Which score answers "unknown" (multi-class predict): msp (the highest calibrated
                probability), energy (T x logsumexp of the logits over T) or none (always a class).
            keep_correct: The "unknown" threshold keeps this share of the correct validation answers.
            optimizer: Optimizer class and arguments; defaults to SGD(lr=0.1, momentum=0.9, nesterov, wd=5e-4).
            lr_schedule: Per-step learning-rate schedule over the whole run (models/schedules.py: OneCycle,
                WarmupCosine, Triangle, Constant; OneCycle by default); an extended run re-plans it.
            norm_bias_lr_scale: Learning-rate multiplier for BatchNorm shifts; their weight decay is divided
                by it, so the decay per step is unchanged.
            backbone_lr_scale: Learning-rate multiplier for every layer of the backbone but its classifier head
                (e.g. 0.1: pretrained layers move ten times slower than the new head).
            test_time_augmentation: Views averaged at validation/test/predict (models/test_time.py: Flip,
                FlipTranslate); none by default.
            channels_last: Keep activations and weights in NHWC memory order (faster convolutions on GPUs).
            compile: Compile the backbone with torch.compile (minutes of compiling before the first step).
            compile_mode: torch.compile mode (inductor): default, reduce-overhead or max-autotune.
            compile_backend: torch.compile backend: inductor (generates kernels), or e.g. aot_eager to debug.
        """
        super().__init__()
        self.save_hyperparameters()
        for name, scale in (("norm_bias_lr_scale", norm_bias_lr_scale), ("backbone_lr_scale", backbone_lr_scale)):
            if scale <= 0:
                raise ValueError(f"model.{name} must be positive, got {scale}")
        self.class_names = list(class_names) if class_names else [str(i) for i in range(num_classes)]
        if len(self.class_names) != num_classes:
            raise ValueError(f"{len(self.class_names)} class names given for {num_classes} classes")
        self.optimizer_factory = optimizer
        self.normalize = Normalize(mean, std)
        self.backbone = build_backbone(backbone or FastCNN, num_classes, image_size)
        self.lr_schedule = lr_schedule or OneCycle
        # Built once against a stand-in optimizer: a bad schedule option fails now, before a run starts.
        self.lr_schedule(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0), 100)
        self.test_time_augmentation = test_time_augmentation or TestTimeAugmentation()
        if channels_last:
            self.backbone.to(memory_format=torch.channels_last)
        self.compiled_backbone: Callable[[Tensor], Tensor] | None = None
        weights = loss_weights(class_weights or ("balanced" if balanced_loss else None), self.class_names,
                               class_counts, task, images_counted)  # fmt: skip
        self.criterion = build_loss(task, loss, weights, label_smoothing)
        self.multilabel = task == "multilabel"
        self.calibration = Calibration(task, num_classes, reject_with, keep_correct)
        metrics = evaluation_metrics(task, num_classes, imbalanced=is_imbalanced(class_counts))
        self.training_totals = TrainingTotals(num_classes)
        self._restored_totals: dict[str, Any] | None = None
        self.val_metrics = metrics.clone(prefix="val/")
        self.test_metrics = metrics.clone(prefix="test/")
        self.example_input_array = torch.zeros(2, 3, image_size, image_size, dtype=torch.uint8)

    def __deepcopy__(self, memo: dict[int, Any]) -> ImageClassifier:
        """A copy (weight averaging keeps one) sharing the optimizer and schedule recipes with this model.

        The config's recipes are jsonargparse callables that hold its parser's lock, which cannot be
        copied; they are never changed, so sharing them is safe.
        """
        for recipe in (self.optimizer_factory, self.lr_schedule):
            memo[id(recipe)] = recipe
        duplicate = self.__class__.__new__(self.__class__)
        memo[id(self)] = duplicate
        duplicate.__setstate__(copy.deepcopy(self.__getstate__(), memo))
        return duplicate

    @override
    def forward(self, images: Tensor) -> Tensor:
        """Logits for a batch of uint8 images of shape (N, 3, image_size, image_size)."""
        return self._backbone(self._normalized(images))

    def evaluate(self, images: Tensor, all_views: bool = True) -> Tensor:
        """Logits averaged over the test-time augmentation's views (one view with ``all_views=False``)."""
        x = self._normalized(images)
        return self.test_time_augmentation(self._backbone, x) if all_views else self._backbone(x)

    def _all_views_now(self) -> bool:
        """False at a validation during fit that is not the last (unless the augmentation says every)."""
        trainer = self.trainer
        if self.test_time_augmentation.during_fit == "every" or trainer.state.fn != "fit":
            return True
        last_step = trainer.max_steps is not None and 0 < trainer.max_steps <= trainer.global_step
        last_epoch = trainer.max_epochs is not None and trainer.current_epoch >= trainer.max_epochs - 1
        return last_step or last_epoch

    def _normalized(self, images: Tensor) -> Tensor:
        x = self.normalize(images)
        return x.contiguous(memory_format=torch.channels_last) if self.hparams.channels_last else x

    def _backbone(self, x: Tensor) -> Tensor:
        return self.compiled_backbone(x) if self.compiled_backbone is not None else self.backbone(x)

    @override
    def configure_model(self) -> None:
        # A compiled bound method rather than an OptimizedModule attribute: the state_dict keys,
        # network() (profiled, exported) and checkpoints stay those of the plain backbone.
        if self.hparams.compile and self.compiled_backbone is None:
            self.compiled_backbone = torch.compile(
                self.backbone.forward, mode=self.hparams.compile_mode, backend=self.hparams.compile_backend
            )

    def network(self) -> nn.Sequential:
        """The inference network alone (shared modules, no trainer attached): safe to copy and profile.

        It outputs calibrated logits (over the fitted temperature): what every exported file computes.
        """
        return nn.Sequential(self.normalize, self.backbone, self.calibration.scaling())

    def _targets(self, labels: Tensor) -> Tensor:
        """Multi-label rows of 0/1 (or mixed shares) as floats; class indices or shares as they are."""
        return labels.float() if self.multilabel else labels

    def _evaluation_step(self, batch: tuple[Tensor, Tensor], metrics: MetricCollection, stage: str) -> Tensor:
        images, labels = batch
        logits = self.evaluate(images, self._all_views_now())
        metrics.update(logits, labels.long() if self.multilabel else labels)
        loss = self.criterion(logits, self._targets(labels))
        self.log(f"{stage}/loss", loss, on_epoch=True, prog_bar=True, sync_dist=True)
        self.log_dict(metrics, on_epoch=True, prog_bar=True)
        return logits

    @override
    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """``labels``: class indices, (N, classes) shares when the data mixes images, or multi-label 0/1 rows."""
        images, labels = batch
        logits = self(images)
        loss = self.criterion(logits, self._targets(labels))
        # Mixed images count as their larger share's class, so train/top1 still compares with val/top1
        # (multi-label: train/top1 is the share of images whose most probable label is one of theirs).
        mixed = labels.dim() == 2 and not self.multilabel
        self.training_totals.add(loss, logits, labels.argmax(dim=1) if mixed else labels)
        return loss

    @override
    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """Returns the logits, for callbacks such as the confusion matrix."""
        logits = self._evaluation_step(batch, self.val_metrics, "val").detach()
        if self._fits_calibration():
            self.calibration.collect(logits, batch[1])
        return logits

    def _fits_calibration(self) -> bool:
        return self.trainer.state.fn == "fit" and not self.trainer.sanity_checking

    @override
    def on_validation_epoch_start(self) -> None:
        self.calibration.reset()

    @override
    def on_validation_epoch_end(self) -> None:
        # Fitted on this validation's images (every rank's: the same numbers on each), before the checkpoints of
        # this validation are written.
        if self._fits_calibration():
            figures = {f"val/{name}": value for name, value in self.calibration.fit().items()}
            self.log_dict(figures, sync_dist=True)

    @override
    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """Returns the logits, for callbacks such as the evaluation report."""
        return self._evaluation_step(batch, self.test_metrics, "test").detach()

    @override
    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """Calibrated probabilities, and which images get an answer (multi-label: which labels each gets)."""
        logits = self.evaluate(batch[0])
        probabilities = self.calibration.probabilities(logits)
        if self.multilabel:
            return {"probabilities": probabilities, "labels": self.calibration.given_labels(probabilities)}
        return {"probabilities": probabilities, "answered": self.calibration.answered(logits)}

    @override
    def configure_optimizers(self):
        groups = self._parameter_groups()
        if self.optimizer_factory is not None:
            optimizer = self.optimizer_factory(groups)
        else:
            optimizer = torch.optim.SGD(groups, lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
        for group in optimizer.param_groups:
            group["lr"] *= group.get("lr_scale", 1.0)
            if "weight_decay" in group:
                group["weight_decay"] *= group.get("weight_decay_scale", 1.0)
        # The schedule spans all optimizer steps of the run as the trainer counts them now.
        scheduler = self.lr_schedule(optimizer, int(self.trainer.estimated_stepping_batches))
        # "name" is LearningRateMonitor's tag: train/lr, or train/lr/<group name> with several parameter groups.
        schedule = {"scheduler": scheduler, "interval": "step", "name": "train/lr"}
        return {"optimizer": optimizer, "lr_scheduler": schedule}

    @override
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # The first batch after a mid-epoch resume continues the checkpoint's sums of that epoch.
        restored, self._restored_totals = self._restored_totals, None
        trainer = self.trainer
        if restored is not None and (restored["epoch"], restored["batches"]) == (trainer.current_epoch, batch_idx):
            device = trainer.strategy.root_device
            self.training_totals.load_state_dict(restored, device, keep_sums=trainer.is_global_zero)

    @override
    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # A run that reaches max_steps inside an epoch would end without validating its final weights
        # (the last val/* would be the previous epoch's). Asking to stop makes Lightning validate now,
        # after every callback's batch end (weight averaging included); the checkpoints follow.
        max_steps = self.trainer.max_steps
        if max_steps is not None and 0 < max_steps <= self.trainer.global_step:
            self.trainer.should_stop = True
        # The step's loss only at the logger's cadence, by Lightning's rule for its own callbacks
        # (a self.log at every step costs more than a small network's step); a stop always logs.
        if at_logging_step(self.trainer):
            self.log("train/loss_step", outputs["loss"], on_step=True, on_epoch=False)

    @override
    def on_train_epoch_end(self) -> None:
        self.log_dict(self.training_totals.means(self.trainer.strategy), on_epoch=True)
        self.training_totals.reset()

    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        trainer = self.trainer
        checkpoint["training_totals"] = self.training_totals.state_dict(trainer.strategy, trainer.current_epoch)
        checkpoint[CHECKPOINT_KEY] = self.calibration.record()

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._restored_totals = checkpoint.get("training_totals")
        self.calibration.restore(checkpoint.get(CHECKPOINT_KEY))

    @override
    def on_train_start(self) -> None:
        # A checkpoint without the schedule's step (e.g. one written by a run without a schedule)
        # still puts the schedule where the run is.
        scheduler = self.lr_schedulers()
        if isinstance(scheduler, Replanned) and scheduler.last_epoch != self.trainer.global_step:
            scheduler.resume_at(self.trainer.global_step)

    def _parameter_groups(self) -> Iterable[Tensor] | list[dict[str, Any]]:
        norm_scale, body_scale = self.hparams.norm_bias_lr_scale, self.hparams.backbone_lr_scale
        if norm_scale == 1.0 and body_scale == 1.0:
            return self.parameters()
        shifts = {id(m.bias) for m in self.modules() if isinstance(m, NORMS) and m.bias is not None}
        head = {id(parameter) for parameter in head_of(self.backbone).parameters()} if body_scale != 1.0 else None
        groups: dict[str, dict[str, Any]] = {}
        for parameter in self.parameters():
            part = "head" if head is None or id(parameter) in head else "body"
            lr_scale = 1.0 if part == "head" else body_scale
            if norm_scale != 1.0 and id(parameter) in shifts:
                # Their weight decay is divided by the multiplier, so the decay per step is unchanged.
                name, lr_scale, decay_scale = f"{part}_norm_biases", lr_scale * norm_scale, 1.0 / norm_scale
            else:
                name, decay_scale = part, 1.0
            group = groups.setdefault(name, {"params": [], "lr_scale": lr_scale, "weight_decay_scale": decay_scale})
            group["params"].append(parameter)
        # Named groups: the learning-rate monitor logs train/lr/<name> (head, body, head_norm_biases, ...).
        names = {"head": "main", "head_norm_biases": "norm_biases"} if head is None else {}
        return [{**group, "name": names.get(name, name)} for name, group in groups.items()]
