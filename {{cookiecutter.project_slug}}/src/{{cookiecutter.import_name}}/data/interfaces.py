"""What other parts of the project may ask of a DataModule, named so that any DataModule can offer it."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import Tensor

from .batches import BatchSizes


@runtime_checkable
class TrainingImages(Protocol):
    """A DataModule that can hand out training images for layers fitted to data (e.g. the WhiteningFit callback)."""

    def train_images(self, count: int) -> Tensor:
        """The first ``count`` training images, uint8 (N, 3, H, W) on the CPU, in a fixed order; after setup()."""
        ...


@runtime_checkable
class ValidationSplit(Protocol):
    """A DataModule that says where ``val/*`` comes from (the fit summary warns when the test set stands in)."""

    @property
    def validates_on_test_set(self) -> bool:
        """True when no training images are held out, so validation reads the test set."""
        ...


@runtime_checkable
class PredictionNames(Protocol):
    """A DataModule that names each image it predicts (the PredictionWriter's ``image`` column)."""

    def predict_name(self, index: int) -> str:
        """What the ``index``-th predicted image is: a file's path inside the folder, or a test-set index."""
        ...


@runtime_checkable
class BatchPlan(Protocol):
    """A DataModule that says what one optimizer step takes (the fit summary and the HPARAMS tab show it)."""

    batches: BatchSizes | None  # after setup()
