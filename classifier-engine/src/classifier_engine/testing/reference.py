"""A small model that keeps ``ClassifierModel`` and nothing more: the library's own tests train it.

It is what a project's model reduces to when every recipe part is left out (a few convolutions, SGD at a
constant rate, one view per image), so the library's tests run every command (fit, resume, test, predict,
export) with no project at hand. ``python -m classifier_engine.testing.reference fit --data.image_dir DIR``
trains it on a folder of photos through ``ImageFolderDataModule`` and the config beside this file;
``... reference export --ckpt_path CKPT`` exports a run of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from typing_extensions import override

from ..models.calibration import Calibration
from ..models.domain import DomainScore
from ..models.network_parts import Normalize, head_input, logits_and_features

REFERENCE_CONFIG = Path(__file__).with_name("reference.yaml")


class TestTimeAugmentation:
    """One view: the image itself (the engine's name for "no test-time augmentation")."""

    __test__ = False  # a library class, not a pytest test class

    def __call__(self, network: nn.Module, images: Tensor) -> Tensor:
        return network(images)


class ReferenceClassifier(L.LightningModule):
    """Three convolutions and a linear head over uint8 images; one label, or a set of labels, each."""

    def __init__(
        self,
        num_classes: int = 10,
        class_names: list[str] | None = None,
        mean: tuple[float, float, float] = (0.5, 0.5, 0.5),
        std: tuple[float, float, float] = (0.25, 0.25, 0.25),
        image_size: int = 32,
        task: str = "multiclass",
        width: int = 8,
        lr: float = 0.05,
        reject_with: DomainScore = "knn",
        keep_in_domain: float = 0.95,
    ) -> None:
        """Build the network.

        Args:
            num_classes: Number of classes (linked from the data).
            class_names: Class names, stored in checkpoints (linked from the data).
            mean: Per-channel mean of the data in [0, 1] (linked from the data).
            std: Per-channel standard deviation of the data in [0, 1] (linked from the data).
            image_size: Side in pixels of the square images (linked from the data).
            task: multiclass or multilabel (linked from the data).
            width: Channels of the first convolution (doubled by each of the next two).
            lr: SGD's learning rate, constant over the run.
            reject_with: Which score finds images unlike the training ones: knn (features), energy, msp or none.
            keep_in_domain: The share of all validation images the "unknown" threshold keeps.
        """
        super().__init__()
        self.save_hyperparameters()
        self.class_names = list(class_names) if class_names else [str(i) for i in range(num_classes)]
        self.image_size, self.multilabel = image_size, task == "multilabel"
        self.normalize = Normalize(mean, std)
        layers: list[nn.Module] = []
        channels = 3
        for out in (width, 2 * width, 4 * width):
            layers += [
                nn.Conv2d(channels, out, 3, padding=1, bias=False),
                nn.BatchNorm2d(out),
                nn.ReLU(),
                nn.MaxPool2d(2),
            ]
            channels = out
        self.backbone = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, num_classes))
        self.test_time_augmentation = TestTimeAugmentation()
        self.calibration = Calibration(task, num_classes, reject_with, 0.95, keep_in_domain)
        self.example_input_array = torch.zeros(2, 3, image_size, image_size, dtype=torch.uint8)

    @override
    def forward(self, images: Tensor) -> Tensor:
        return self.backbone(self.normalize(images))

    def evaluate(self, images: Tensor, all_views: bool = True) -> Tensor:
        return self.test_time_augmentation(self.backbone, self.normalize(images))

    def features(self, images: Tensor) -> Tensor:
        return head_input(self.backbone[-1], self.backbone, self.normalize(images))

    def network(self) -> nn.Sequential:
        return nn.Sequential(self.normalize, self.backbone, self.calibration.scaling())

    def _loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        if self.multilabel:
            return F.binary_cross_entropy_with_logits(logits, labels.float())
        return F.cross_entropy(logits, labels)

    @override
    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> dict[str, Tensor]:
        logits = self(batch[0])
        return {"loss": self._loss(logits, batch[1]), "logits": logits.detach()}

    @override
    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self._evaluation_step(batch, "val")

    @override
    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self._evaluation_step(batch, "test")

    def _evaluation_step(self, batch: tuple[Tensor, Tensor], stage: str) -> Tensor:
        images, labels = batch
        logits = self.evaluate(images)
        self.log(f"{stage}/loss", self._loss(logits, labels), on_epoch=True)
        if not self.multilabel:
            self.log(f"{stage}/top1", (logits.argmax(dim=1) == labels).float().mean(), on_epoch=True)
        return logits.detach()

    @override
    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> dict[str, Tensor]:
        logits, features = logits_and_features(self.backbone[-1], lambda: self.evaluate(batch[0]))
        return self.calibration.answers(logits, features)

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.calibration.restore_from(checkpoint)

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


if __name__ == "__main__":  # python -m classifier_engine.testing.reference [export] ARGS: main.py or export.py
    import sys

    from classifier_engine import run_export, run_main

    command = run_export if sys.argv[1:2] == ["export"] else run_main
    del sys.argv[1 : 2 if command is run_export else 1]
    command(ReferenceClassifier, REFERENCE_CONFIG)
