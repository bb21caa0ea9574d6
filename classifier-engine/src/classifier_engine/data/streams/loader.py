"""litdata's loader for a training split, its epochs and position the trainer's (``streamed.py`` makes it).

litdata counts epochs by the iterators made and restores a position from its own ``state_dict``,
which counts the batch the trainer's fetcher prefetched; the trainer's restored progress is what was
trained (the reason ``loader.py`` skips batches for the memory map). The loader here starts each
epoch's iterator at its first batch, from the trainer's epoch and batch count, and, on another
topology, from litdata's restripe of the rest (``stream_position.py``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ...foundation.process_lifetime import start_worker
from . import position as stream_position
from .object_store import configure_store_client


def concatenated(items: Sequence[dict[str, Any]]) -> tuple[Tensor, Tensor, Tensor]:
    """A batch of items (each a few images) as one batch of images, labels and ids."""
    images = torch.from_numpy(np.concatenate([item["images"] for item in items]))
    labels = torch.from_numpy(np.concatenate([item["labels"] for item in items]))
    ids = torch.from_numpy(np.concatenate([item["ids"] for item in items]))
    return images, labels, ids


def stream_worker_init(worker_id: int) -> None:
    configure_store_client()
    start_worker(worker_id)


def loader_class() -> type:
    from litdata import StreamingDataLoader

    class EpochStreamingLoader(StreamingDataLoader):
        """litdata's loader whose epoch and position are the trainer's (made on first use: litdata is optional)."""

        def __init__(
            self,
            *args: Any,
            current_epoch: Callable[[], int | None],
            batches_done: Callable[[], int],
            start_segment: Callable[[int, int, int], tuple[stream_position.Segment, dict[str, Any] | None]],
            restored_steps: Callable[[], int],
            **kwargs: Any,
        ) -> None:
            super().__init__(*args, **kwargs)
            self.trainer_epoch, self.batches_done = current_epoch, batches_done
            self.start_segment, self.restored_steps = start_segment, restored_steps
            self.workers = self.num_workers  # the configured count (a restriped rest is read by one)

        def __len__(self) -> int:
            # An epoch resumed on other ranks or workers keeps the steps of the layout it began with.
            return max(super().__len__(), self.restored_steps())

        def __iter__(self) -> Iterator[Any]:
            # Started at the first batch: a resumed fit makes its iterator before it restores its progress.
            batches = super().__iter__()

            def from_first_batch() -> Iterator[Any]:
                left = self._start_epoch()
                yield from batches if left is None else itertools.islice(batches, left)

            return from_first_batch()

        def _start_epoch(self) -> int | None:
            """Set litdata's position to the trainer's; the batches this rank has left when restriped, else None."""
            epoch = self.trainer_epoch()
            if epoch is None:
                return None
            done = self.batches_done()
            self.num_workers = self.workers
            segment, elastic = self.start_segment(epoch, done, super().__len__())
            if elastic:
                # litdata deals the rest a batch per rank and worker in turn, then drops what does not fill a
                # batch for every worker; with one worker per rank that is less than a step, so each rank has
                # the steps the epoch has left (it stops after them, in step with the others).
                self.num_workers = min(1, self.workers)
            if done:
                self._resume(epoch + 1, done, elastic)  # litdata counts epochs from 1
            else:
                self.restore = False
                self.current_epoch = epoch  # litdata adds one as a fresh epoch starts
            return segment.steps - done if elastic else None

        def _resume(self, epoch: int, done: int, elastic: dict[str, Any] | None) -> None:
            """At batch ``done``: litdata's replay of this topology's layout, or its restripe of the rest."""
            self.current_epoch = epoch
            self.dataset.set_epoch(epoch)
            self.dataset.reset_state_dict()
            yielded = 0 if elastic else done * self.batch_size
            dataset_state = self.dataset.state_dict(yielded, self.num_workers, self.batch_size)
            dataset_state.update(elastic or {})
            state = {
                "dataset": dataset_state,
                "current_epoch": epoch,
                "num_samples_yielded": yielded,
                "latest_worker_idx": (done - 1) % max(1, self.num_workers),
            }
            self.load_state_dict(state)

    return EpochStreamingLoader
