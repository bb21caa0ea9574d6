"""The photo render's DataModule with its split() and its augmentation rewritten as a user would."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from photo_classifier.data import PhotoDataModule

from classifier_engine import BatchAugment


class LastTwoHeldOut(PhotoDataModule):
    """Validates on the last two photos of each class (in listing order), whatever ``data.val_fraction`` says."""

    def split(self, labels: np.ndarray, fractions: tuple[float, float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        val = np.sort(np.concatenate([np.flatnonzero(labels == label)[-2:] for label in np.unique(labels)]))
        return np.setdiff1d(np.arange(len(labels)), val), val, np.empty(0, dtype=np.int64)


class MarkingAugment(BatchAugment):
    """A shift and a mirror, and ``augmented-by-the-project`` in the working folder once it has run."""

    def __call__(self, *args, **kwargs):
        Path("augmented-by-the-project").touch()
        return super().__call__(*args, **kwargs)


class OwnAugmentation(LastTwoHeldOut):
    """``LastTwoHeldOut`` whose training batches go through ``MarkingAugment``."""

    def sized_augmentation(self) -> BatchAugment:
        return MarkingAugment(crop_padding=2, num_classes=self.num_classes, output_size=self.image_size)
