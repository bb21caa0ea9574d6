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
- A checkpoint written in the middle of an epoch (SIGTERM, Ctrl-C, SIGUSR1, every N steps)
  resumes at the batch after the last one trained, with the epoch's order unchanged: the
  loader's first iterator of a resumed epoch skips the batches the trainer's restored progress
  says were done (``batches_done``), without reading them. That count comes from the trainer's
  own loop state rather than from a loader ``state_dict``, which Lightning 2.6 can fail to
  restore when ``trainer.estimated_stepping_batches`` sets the loaders up early (Lightning issue
  #20550; the learning-rate schedules ask for it) and which would also count the fetcher's
  prefetched batch.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from typing_extensions import override


class FirstBatchStartLoader(DataLoader):
    """``DataLoader`` whose iterators start (and read the sampler) at their first batch, after the batches already done.

    ``batches_done`` returns how many batches of the current epoch were trained before a resume
    (0 otherwise); the epoch's length stays the full one.
    """

    def __init__(self, *args: Any, batches_done: Callable[[], int] = lambda: 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batches_done = batches_done
        self._resumable: _SkipAtStart | None = None

    @property
    @override
    def _index_sampler(self) -> _SkipAtStart:
        # One object for the loader's life: a persistent-workers iterator keeps the one it was made with.
        if self._resumable is None:
            self._resumable = _SkipAtStart(super()._index_sampler)
        return self._resumable

    def __iter__(self) -> Iterator[Any]:
        return _StartsAtFirstBatch(self)


class _SkipAtStart:
    """A batch sampler whose next iteration starts ``skip`` batches in; its length is the whole epoch's."""

    def __init__(self, batch_sampler: Any) -> None:
        self.batch_sampler = batch_sampler
        self.skip = 0

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(iter(self.batch_sampler), self.skip, None)

    def __len__(self) -> int:
        return len(self.batch_sampler)


class _StartsAtFirstBatch(Iterator[Any]):
    def __init__(self, loader: FirstBatchStartLoader) -> None:
        self.loader = loader
        self.iterator: Iterator[Any] | None = None

    def __next__(self) -> Any:
        if self.iterator is None:
            batches = self.loader._index_sampler
            batches.skip = self.loader.batches_done()  # read while the iterator (and its workers) start
            try:
                self.iterator = DataLoader.__iter__(self.loader)
            finally:
                batches.skip = 0
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


class BalancedEpochSampler(TrainerEpochSampler):
    """Draws each class equally often: ``weights`` per image, with replacement, an epoch's worth per rank.

    The draw of epoch e comes from (seed, e) alone and is dealt round-robin over the ranks, so it is
    disjoint per draw, the same on every rank count's shards, and a resumed run sees the batches the
    uninterrupted one would (the loader skips those already trained, as for the shuffled order).
    """

    def __init__(
        self, dataset: Dataset, current_epoch: Callable[[], int | None], weights: torch.Tensor, **kwargs: Any
    ) -> None:
        super().__init__(dataset, current_epoch, **kwargs)
        self.weights = weights.double()

    def __iter__(self) -> Iterator[int]:
        epoch = self.current_epoch()
        if epoch is not None:
            self.epoch = epoch
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        drawn = torch.multinomial(self.weights, self.total_size, replacement=True, generator=generator)
        return iter(drawn[self.rank : self.total_size : self.num_replicas].tolist())
