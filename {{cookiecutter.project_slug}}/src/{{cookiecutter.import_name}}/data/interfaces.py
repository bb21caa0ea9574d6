"""What other parts of the project may ask of a DataModule, named so that any DataModule can offer it."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import Tensor


@runtime_checkable
class TrainingImages(Protocol):
    """A DataModule that can hand out training images for layers fitted to data (e.g. the WhiteningFit callback)."""

    def train_images(self, count: int) -> Tensor:
        """The first ``count`` training images, uint8 (N, 3, H, W) on the CPU, in a fixed order; after setup()."""
        ...
