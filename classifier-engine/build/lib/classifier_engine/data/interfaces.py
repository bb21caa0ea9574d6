"""What other parts of the project may ask of a DataModule, named so that any DataModule can offer it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
from torch import Tensor

from .batches import BatchSizes
from .dataset import Rows


@runtime_checkable
class Fingerprinted(Protocol):
    """A DataModule class that says what data a command reads before anything is built (part of the run's identity)."""

    @classmethod
    def data_fingerprint(cls, settings: Mapping[str, Any], stage: str) -> str:
        """What the data is, not where it lies (e.g. a dataset's name and checksum), from the ``data.*`` settings."""
        ...


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
class DataSummary(Protocol):
    """A DataModule that says in a few words what a run trained on (the fit summary's ``Data:`` line)."""

    def data_summary(self) -> str | None:
        """E.g. '2,880 training and 320 validation images of 4 classes at 64 px (photos)'; after setup()."""
        ...


@runtime_checkable
class BatchPlan(Protocol):
    """A DataModule that says what one optimizer step takes (the fit summary and the HPARAMS tab show it)."""

    batches: BatchSizes | None  # after setup()


@dataclass(frozen=True)
class HeldOutImages:
    """The images a trained model is judged on, as the run held them out."""

    split: str  # "test", or "val" where the data has no test split
    images: np.ndarray | Rows  # uint8 (N, 3, S, S), read when indexed
    labels: np.ndarray  # int64 (N,)
    names: list[str]  # what each image is: a file's path inside its folder, or a row of the split
    dataset: str  # what the data is, in a few words (e.g. "CIFAR-10", "images of photos")
    source: str  # the folder the images are read from


@runtime_checkable
class EvaluationData(Protocol):
    """A DataModule that hands out a trained run's images outside a Trainer: what ``export.py`` judges and calibrates.

    Rebuilt from a checkpoint, with its state restored, prepared and set up for ``test``.
    """

    def use_data_dir(self, folder: Path) -> None:
        """Read the data from ``folder`` instead of where the run read it (``export.py --data_dir``); before setup()."""
        ...

    def held_out_images(self) -> HeldOutImages:
        """The split the run is judged on; after setup()."""
        ...

    def training_sample(self, count: int, seed: int = 0) -> np.ndarray:
        """``count`` training images (all of them if fewer), drawn by ``seed``, uint8 (N, 3, S, S); after setup()."""
        ...


@runtime_checkable
class FoldedData(Protocol):
    """A DataModule that cross-validates: ``data.folds`` and ``data.fold`` hold one fold out for validation.

    What ``check_labels.py`` needs: each fold's run validates on images it did not train on.
    """

    folds: int
    fold: int

    def validation_images(self) -> HeldOutImages:
        """The validation split (the fold held out), as evaluation serves it; after setup()."""
        ...
