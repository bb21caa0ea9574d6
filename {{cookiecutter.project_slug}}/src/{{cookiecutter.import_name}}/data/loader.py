"""Training order that follows the trainer's epoch, read when the first batch of an epoch is asked for.

Two things in Lightning 2.6 would otherwise make a resumed run see other batches than the
uninterrupted one:

- A resumed ``fit`` makes the training iterator before it calls ``set_epoch`` on the sampler,
  and a loader with worker processes draws its first indices the moment its iterator is made,
  so the resumed epoch would replay epoch 0's order. ``FirstBatchStartLoader`` starts the real
  iterator at the first ``next()`` instead.
- When a ``max_steps`` run resumes from an epoch boundary, the counter Lightning passes to
  ``set_epoch`` runs one ahead of ``trainer.current_epoch``. ``TrainerEpochSampler`` takes the
  epoch from the trainer itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader, Dataset, DistributedSampler


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


class TrainerEpochSampler(DistributedSampler):
    """``DistributedSampler`` whose permutation is that of ``current_epoch()`` when iteration starts.

    ``current_epoch`` returns the trainer's epoch, or None outside a trainer (then ``set_epoch``
    decides, as usual).
    """

    def __init__(self, dataset: Dataset, current_epoch: Callable[[], int | None], **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self.current_epoch = current_epoch

    def __iter__(self) -> Iterator[int]:
        epoch = self.current_epoch()
        if epoch is not None:
            self.epoch = epoch
        return super().__iter__()
