"""airbench94's data-fitted start: the patch-whitening layer is fitted to training images, its bias trains briefly."""

from __future__ import annotations

import lightning as L
import torch
from typing_extensions import override

from classifier_engine import TrainingImages

from ..models.backbones import PatchWhitening


class WhiteningFit(L.Callback):
    """Fit every ``PatchWhitening`` layer of the model to training images when fit starts; freeze their bias later.

    The images come from the DataModule through ``data.interfaces.TrainingImages``. A resumed run
    fits too, then loads its own weights over the result; every process fits on the same images
    (the first ``images`` of the training split, in float64 on the CPU), so DDP ranks agree.
    """

    def __init__(self, images: int = 5000, bias_epochs: int = 3) -> None:
        """Configure the fit.

        Args:
            images: Training images the whitening filters are fitted to.
            bias_epochs: Epochs during which the whitening layers' bias trains (then it stays as it is).
        """
        if images < 1 or bias_epochs < 0:
            raise ValueError(f"WhiteningFit needs images >= 1 and bias_epochs >= 0, got {images} and {bias_epochs}")
        self.images = images
        self.bias_epochs = bias_epochs
        self.layers: list[PatchWhitening] = []

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.layers = [module for module in pl_module.modules() if isinstance(module, PatchWhitening)]
        if stage != "fit" or not self.layers:
            return
        datamodule = trainer.datamodule
        if not isinstance(datamodule, TrainingImages):
            raise ValueError(
                "WhiteningFit fits the whitening layer to training images and needs a DataModule offering "
                "them (data.interfaces.TrainingImages: train_images(count)), such as CifarDataModule"
            )
        # Normalized as the network sees them (ImageClassifier.normalize).
        images = pl_module.normalize(datamodule.train_images(self.images))
        for layer in self.layers:
            layer.fit(images)

    @override
    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if trainer.current_epoch < self.bias_epochs:
            return
        for layer in self.layers:
            layer.bias.grad = None  # the optimizer skips parameters without a gradient
