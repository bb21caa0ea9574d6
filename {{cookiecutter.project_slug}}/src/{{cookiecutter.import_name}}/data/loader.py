"""A DataLoader that reads its sampler when the first batch is asked for, not when its iterator is made.

A resumed ``fit`` makes the training iterator before Lightning calls ``set_epoch`` on the
sampler, and a loader with worker processes draws its first indices the moment its iterator
is made: the resumed epoch would replay epoch 0's order. Starting the real iterator at the
first ``next()`` puts every read of the sampler after ``set_epoch``, whatever the number of
workers and whenever Lightning makes the iterator.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader


class FirstBatchStartLoader(DataLoader):
    """``DataLoader`` whose iterators start (and read the sampler) at their first batch."""

    def __iter__(self) -> Iterator[Any]:
        return _StartsAtFirstBatch(self)


class _StartsAtFirstBatch(Iterator[Any]):
    def __init__(self, loader: FirstBatchStartLoader) -> None:
        self.loader = loader
        self.iterator: Iterator[Any] | None = None

    def __next__(self) -> Any:
        if self.iterator is None:
            self.iterator = DataLoader.__iter__(self.loader)
        return next(self.iterator)

    def __len__(self) -> int:
        return len(self.loader)
