"""A map-style dataset that hands out whole batches gathered from memory-mapped arrays.

``DataLoader`` calls ``__getitems__`` with a batch of indices, so a batch is one fancy
index into the page cache rather than N ``__getitem__`` calls and a collate. Because it
is an ordinary map-style dataset under an ordinary sampler, Lightning can swap in a
``DistributedSampler`` under DDP and every rank reads its own shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset


class MemmapBatches(Dataset):
    """Images (N, 3, 32, 32) uint8 and labels (N,) int64, optionally restricted to ``indices``."""

    def __init__(self, images: Path, labels: Path, indices: np.ndarray | None = None) -> None:
        self.paths = (Path(images), Path(labels))
        self.indices = indices
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None
        self._length = len(indices) if indices is not None else len(self.arrays[1])

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        # Opened lazily in each process: worker processes share the page cache, not a copy.
        if self._arrays is None:
            self._arrays = tuple(np.load(path, mmap_mode="r") for path in self.paths)
        return self._arrays

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_arrays": None}

    def __len__(self) -> int:
        return self._length

    def __getitems__(self, positions: Sequence[int]) -> tuple[Tensor, Tensor]:
        rows = np.asarray(positions, dtype=np.int64)
        if self.indices is not None:
            rows = self.indices[rows]
        images, labels = self.arrays
        return torch.from_numpy(images[rows]), torch.from_numpy(labels[rows])

    def __getitem__(self, position: int) -> tuple[Tensor, Tensor]:
        images, labels = self.__getitems__([position])
        return images[0], labels[0]


def keep_batch(batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """Collate function for ``MemmapBatches``: the dataset already returns a stacked batch."""
    return batch
