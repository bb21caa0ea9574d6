"""Map-style datasets that hand out whole batches: from memory-mapped arrays, or from the device.

``DataLoader`` calls ``__getitems__`` with a batch of indices, so a batch is one fancy
index into the page cache rather than N ``__getitem__`` calls and a collate. Because these
are ordinary map-style datasets under an ordinary sampler, the batch order is the sampler's
(a ``DistributedSampler`` under DDP), whichever of the two stores the pixels.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from .errors import DataSettingError
from .folds import fold_of_each
from .image_files import centre_crop


class Rows:
    """Some rows of a memory-mapped array, read only when indexed (a held-out split inside the training file).

    With ``size``, each image's centre ``size`` x ``size`` (images packed with an evaluation crop's margin).
    """

    def __init__(self, array: np.ndarray, rows: np.ndarray | None = None, size: int | None = None) -> None:
        self.array, self.rows, self.size = array, rows, size

    def __len__(self) -> int:
        return len(self.rows) if self.rows is not None else len(self.array)

    def __getitem__(self, key: slice | np.ndarray) -> np.ndarray:
        images = self.array[self.rows[key]] if self.rows is not None else self.array[key]
        return centre_crop(images, self.size) if self.size is not None else images


class MemmapBatches(Dataset):
    """Images (N, 3, 32, 32) uint8 and labels (N,) int64, optionally restricted to ``indices``.

    With ``with_ids`` a batch also carries each image's row in its file: a stable identity that
    per-image augmentations (the alternating flip) key on.
    """

    def __init__(self, images: Path, labels: Path, indices: np.ndarray | None = None, with_ids: bool = False) -> None:
        self.paths = (Path(images), Path(labels))
        self.indices = indices
        self.with_ids = with_ids
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None
        self._length = len(indices) if indices is not None else len(self.arrays[1])

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        # Opened lazily in each process: worker processes share the page cache, not a copy.
        if self._arrays is None:
            self._arrays = tuple(np.load(path, mmap_mode="r") for path in self.paths)
        return self._arrays

    def view(self, size: int | None = None) -> tuple[np.ndarray | Rows, np.ndarray]:
        """The split's images (their centre ``size`` x ``size``), read only when indexed, and its labels.

        For reading a split outside a loader.
        """
        images, labels = self.arrays
        if self.indices is None and (size is None or images.shape[-1] == size):
            return images, np.asarray(labels)
        chosen = labels[self.indices] if self.indices is not None else labels
        return Rows(images, self.indices, size), np.asarray(chosen)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_arrays": None}

    def __len__(self) -> int:
        return self._length

    def __getitems__(self, positions: Sequence[int]) -> tuple[Tensor, ...]:
        rows = np.asarray(positions, dtype=np.int64)
        if self.indices is not None:
            rows = self.indices[rows]
        images, labels = self.arrays
        batch = (torch.from_numpy(images[rows]), torch.from_numpy(labels[rows]))
        return (*batch, torch.from_numpy(rows)) if self.with_ids else batch

    def __getitem__(self, position: int) -> tuple[Tensor, ...]:
        return tuple(part[0] for part in self.__getitems__([position]))


class Positions(NamedTuple):
    """A batch of a device-resident split before it is gathered: which split, which positions."""

    split: str
    positions: Tensor


class ResidentBatches(Dataset):
    """A whole split copied once to ``device``; the loader only hands out positions.

    The positions (a few kilobytes) are what crosses to the device each step; the DataModule
    gathers the pixels there, so there are no workers and no per-step host-to-device image copy.
    """

    def __init__(self, split: str, source: MemmapBatches, device: torch.device) -> None:
        self.split = split
        self.tensors = tuple(part.to(device) for part in source.__getitems__(range(len(source))))

    @property
    def nbytes(self) -> int:
        return sum(part.nbytes for part in self.tensors)

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitems__(self, positions: Sequence[int]) -> Positions:
        return Positions(self.split, torch.as_tensor(positions, dtype=torch.int64))

    def gather(self, positions: Tensor) -> tuple[Tensor, ...]:
        """The batch at ``positions`` (a tensor on the split's device)."""
        return tuple(part.index_select(0, positions) for part in self.tensors)  # ~16x faster than [] on CPUs


class TensorBatches(Dataset):
    """Images already in memory (a folder of your own, for predict), with a label of -1 each."""

    def __init__(self, images: Tensor) -> None:
        self.images = images
        self.labels = torch.full((len(images),), -1, dtype=torch.int64)

    def __len__(self) -> int:
        return len(self.images)

    def __getitems__(self, positions: Sequence[int]) -> tuple[Tensor, Tensor]:
        rows = torch.as_tensor(positions, dtype=torch.int64)
        return self.images[rows], self.labels[rows]


def keep_batch(batch: tuple[Tensor, ...] | Positions) -> tuple[Tensor, ...] | Positions:
    """Collate function for these datasets: they already return a whole batch."""
    return batch


def cross_validation_folds(
    split: MemmapBatches, folds: int, fold: int | None, seed: int, groups: np.ndarray | None = None
) -> tuple[MemmapBatches, MemmapBatches]:
    """(the training rows but fold ``fold``, fold ``fold``) of ``folds`` folds of ``split`` (``folds.py``).

    Stratified by class (several labels: iteratively), seeded, and with ``groups`` (one per row of ``split``)
    never splitting a group; the folds of one seed partition the split: every image is held out exactly once.
    ``fold`` None holds none out: every row trains (the cross-validation's final model), none validates.
    """
    images, labels = split.paths
    rows = split.indices if split.indices is not None else np.arange(len(split))
    if fold is None:
        held = np.zeros(len(rows), dtype=bool)
    else:
        held = fold_of_each(np.asarray(split.arrays[1])[rows], folds, seed, groups) == fold
    if fold is not None and not held.any():
        raise DataSettingError(
            f"data.folds={folds} leaves fold {fold} without images ({len(rows)} training images, dealt by class"
            f"{' and group' if groups is not None else ''}); lower data.folds or add images"
        )
    return (
        MemmapBatches(images, labels, rows[~held], with_ids=split.with_ids),
        MemmapBatches(images, labels, rows[held]),
    )
