"""The LightningModule: uint8 images in, logits out; ``classifier_engine.ClassifierModel``, checked at start.

Rewrite any step: what resume and calibrated answers rest on (the calibration fitted after each validation,
the training totals, the final validation, the schedule's step) are the engine's callbacks, installed always.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor, nn
from torchmetrics import MetricCollection
from typing_extensions import override

import classifier_engine as engine
from classifier_engine import ClassWeights, DomainScore, LossFactory, Task

from .backbones import BackboneFactory, FastCNN, build_backbone, head_of
from .schedules import OneCycle, ScheduleFactory
from .test_time import TestTimeAugmentation


class ImageClassifier(L.LightningModule):
    """Trains any backbone on uint8 images, one label or a set of labels each; the recipe's parts are arguments.

    Network, schedule and test-time views are objects the config builds (``class_path``); the rest is callbacks.
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
        reject_with: DomainScore = "knn",
        keep_in_domain: float = 0.95,
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
            backbone: The network (models/backbones.py: {% if cookiecutter.dataset == "images" %}TimmNet, FastCNN{% else %}FastCNN, AirBench, CifarResNet{% endif %}; or your own nn.Module).
            label_smoothing: Label smoothing of the cross-entropy loss (multi-class).
            class_weights: Weight of each class in the loss: null (all 1), balanced (the inverse of each class's
                share of the training images; multi-label: negatives / positives, as pos_weight) or {class: weight}.
            balanced_loss: The same as class_weights: balanced (the name of releases before 1.2).
            loss: The training loss instead of the task's own (cross-entropy, or BCE with logits for multi-label),
                e.g. class_path: timm.loss.AsymmetricLossMultiLabel; called with the class weights, if any.
            reject_with: Score of "unknown" for images unlike the training ones: knn (features), energy, msp or none.
            keep_in_domain: The "unlike the training images" threshold keeps this share of all validation images.
            keep_correct: One label: the "likely mistake" threshold keeps this share of correct validation answers.
            optimizer: Optimizer class and arguments; defaults to SGD(lr=0.1, momentum=0.9, nesterov, wd=5e-4).
            lr_schedule: Per-step learning-rate schedule over the run (models/schedules.py: OneCycle, {% if cookiecutter.dataset == "images" %}WarmupCosine{% else %}Triangle{% endif %},
                Constant; OneCycle by default).
            norm_bias_lr_scale: Learning-rate multiplier for BatchNorm shifts (their weight decay divided by it).
            backbone_lr_scale: Learning-rate multiplier for every layer but the classifier head (e.g. 0.1 to fine-tune).
            test_time_augmentation: Views averaged at validation/test/predict (models/test_time.py); none by default.
            channels_last: Keep activations and weights in NHWC memory order (faster convolutions on GPUs).
            compile: Compile the backbone with torch.compile (minutes of compiling before the first step).
            compile_mode: torch.compile mode (inductor): default, reduce-overhead or max-autotune.
            compile_backend: torch.compile backend: inductor (generates kernels), or e.g. aot_eager to debug.
        """
        super().__init__()
        self.save_hyperparameters()
        engine.check_lr_scales(norm_bias_lr_scale, backbone_lr_scale)
        self.class_names = list(class_names) if class_names else [str(i) for i in range(num_classes)]
        if len(self.class_names) != num_classes:
            raise ValueError(f"{len(self.class_names)} class names given for {num_classes} classes")
        self.image_size, self.multilabel = image_size, task == "multilabel"
        self.normalize = engine.Normalize(mean, std)
        self.backbone = build_backbone(backbone or FastCNN, num_classes, image_size)
        # Shared, not copied, by the copy weight averaging keeps (a config's recipes hold its parser's lock).
        self.optimizer_factory = engine.SharedRecipe(optimizer)
        self.lr_schedule = engine.ScheduleRecipe(lr_schedule or OneCycle)  # tried now: a bad option fails here
        self.test_time_augmentation = test_time_augmentation or TestTimeAugmentation()
        self.backbone.to(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
        self.compiled_backbone: Callable[[Tensor], Tensor] | None = None
        weighting = class_weights or ("balanced" if balanced_loss else None)
        weights = engine.loss_weights(weighting, self.class_names, class_counts, task, images_counted)
        self.criterion = engine.build_loss(task, loss, weights, label_smoothing)
        self.calibration = engine.Calibration(task, num_classes, reject_with, keep_correct, keep_in_domain)
        metrics = engine.evaluation_metrics(task, num_classes, imbalanced=engine.is_imbalanced(class_counts))
        self.val_metrics, self.test_metrics = metrics.clone(prefix="val/"), metrics.clone(prefix="test/")
        self.example_input_array = torch.zeros(2, 3, image_size, image_size, dtype=torch.uint8)

    @override
    def forward(self, images: Tensor) -> Tensor:
        """Logits for a batch of uint8 images of shape (N, 3, image_size, image_size)."""
        return self._backbone(self._normalized(images))

    def evaluate(self, images: Tensor, all_views: bool = True) -> Tensor:
        """Logits averaged over the test-time augmentation's views (one view with ``all_views=False``)."""
        x = self._normalized(images)
        return self.test_time_augmentation(self._backbone, x) if all_views else self._backbone(x)

    def features(self, images: Tensor) -> Tensor:
        """The penultimate features (N, D) of uint8 images: what the classifier head takes."""
        return engine.head_input(head_of(self.backbone), self._backbone, self._normalized(images))

    def _normalized(self, images: Tensor) -> Tensor:
        x = self.normalize(images)
        return x.contiguous(memory_format=torch.channels_last) if self.hparams.channels_last else x

    def _backbone(self, x: Tensor) -> Tensor:
        return self.compiled_backbone(x) if self.compiled_backbone is not None else self.backbone(x)

    @override
    def configure_model(self) -> None:
        # A compiled bound method, not an OptimizedModule: state_dict keys, network(), checkpoints stay plain.
        if self.hparams.compile and self.compiled_backbone is None:
            self.compiled_backbone = torch.compile(
                self.backbone.forward, mode=self.hparams.compile_mode, backend=self.hparams.compile_backend
            )

    def network(self) -> nn.Sequential:
        """The inference network alone, calibrated logits out (shared modules): what every exported file computes."""
        return nn.Sequential(self.normalize, self.backbone, self.calibration.scaling())

    def _targets(self, labels: Tensor) -> Tensor:
        """Multi-label rows of 0/1 (or mixed shares) as floats; class indices or shares as they are."""
        return labels.float() if self.multilabel else labels

    def _evaluation_step(self, batch: tuple[Tensor, Tensor], metrics: MetricCollection, stage: str) -> Tensor:
        images, labels = batch
        logits = self.evaluate(images, self.test_time_augmentation.all_views_now(self.trainer))
        metrics.update(logits, labels.long() if self.multilabel else labels)
        loss = self.criterion(logits, self._targets(labels))
        self.log(f"{stage}/loss", loss, on_epoch=True, prog_bar=True, sync_dist=True)
        self.log_dict(metrics, on_epoch=True, prog_bar=True)
        return logits

    @override
    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """Loss and logits (the engine sums train/top1 from them); labels: indices, mixed shares or 0/1 rows."""
        logits = self(batch[0])
        return {"loss": self.criterion(logits, self._targets(batch[1])), "logits": logits.detach()}

    @override
    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """Returns the logits: the calibration is fitted on them; callbacks such as the confusion matrix read them."""
        return self._evaluation_step(batch, self.val_metrics, "val").detach()

    @override
    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """Returns the logits, for callbacks such as the evaluation report."""
        return self._evaluation_step(batch, self.test_metrics, "test").detach()

    @override
    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """Calibrated probabilities, which images get an answer (multi-label: which labels each gets), and how
        like the training images each is (its features come from the same forward pass)."""
        logits, features = engine.logits_and_features(head_of(self.backbone), lambda: self.evaluate(batch[0]))
        return self.calibration.answers(logits, features)

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """The fitted calibration, for ``load_from_checkpoint`` too (a command's guarantee then finds it taken)."""
        self.calibration.restore_from(checkpoint)

    @override
    def configure_optimizers(self) -> dict[str, Any]:
        head = head_of(self.backbone) if self.hparams.backbone_lr_scale != 1.0 else None
        groups = engine.parameter_groups(self, head, self.hparams.norm_bias_lr_scale, self.hparams.backbone_lr_scale)
        optimizer = engine.build_optimizer(groups, self.optimizer_factory.recipe)
        scheduler = self.lr_schedule(optimizer, int(self.trainer.estimated_stepping_batches))
        # "name" is LearningRateMonitor's tag: train/lr, or train/lr/<group name> with several parameter groups.
        schedule = {"scheduler": scheduler, "interval": "step", "name": "train/lr"}
        return {"optimizer": optimizer, "lr_scheduler": schedule}
