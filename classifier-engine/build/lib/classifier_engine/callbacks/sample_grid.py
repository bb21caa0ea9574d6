"""A picture of what the model is fed: the first augmented training batch, as a grid."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torchvision.utils import make_grid
from typing_extensions import override

from .tensorboard import tensorboard_writers


class SampleGrid(L.Callback):
    """Log ``train/augmented_batch`` once, when fitting starts, after the device-side augmentation.

    Batches are uint8 pixels until the model's first layer, so the grid shows exactly the
    augmented images, with no normalization to undo.
    """

    def __init__(self, num_images: int = 64, images_per_row: int = 8) -> None:
        """Configure the grid.

        Args:
            num_images: How many images of the first batch to show.
            images_per_row: Images per row of the grid.
        """
        self.num_images = num_images
        self.images_per_row = images_per_row
        self._logged = False

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._logged or not trainer.is_global_zero:
            return
        self._logged = True
        images = batch[0][: self.num_images].detach().cpu()
        if images.is_floating_point():  # mixed images (MixUp) are floats in [0, 255]
            images = images.round().clamp(0, 255).to(torch.uint8)
        grid = make_grid(images, nrow=self.images_per_row, padding=2)
        for writer in tensorboard_writers(trainer, self, "sample grids"):
            writer.add_image("train/augmented_batch", grid, trainer.global_step)
