"""Where a streamed epoch resumes when a job comes back on another number of ranks or loader workers.

litdata lays out each epoch's order for a topology: the ranks, nodes, loader workers and items per
batch. Its own resume replays that layout, exact for the same topology. On another one it can restripe
what the epoch has not trained yet over the new ranks and workers (its elastic resume, in the first
topology's canonical order), if it is told what its state does not hold across a restart from the
trainer's progress: the topology the epoch's order was laid out for, and how many items all ranks
have trained. A ``Segment`` keeps both in the DataModule's checkpoint state.

What is promised: the same topology resumes bit-exact; another one trains the rest of the epoch the
uninterrupted run would have trained, none of it twice (read by one loader worker per rank: see
``streamed.py``). The trainer counts batches, so the images per step over all ranks must stay as they
were (``data.global_batch_size`` keeps them when the number of ranks changes).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..errors import DataSettingError


@dataclass(frozen=True)
class Topology:
    """What litdata's order of an epoch depends on besides the seed and the epoch."""

    world_size: int
    num_nodes: int
    num_workers: int
    items_per_batch: int  # litdata's batch size: items per rank per step

    @property
    def items_per_step(self) -> int:
        return self.world_size * self.items_per_batch


@dataclass(frozen=True)
class Segment:
    """The stretch of ``epoch`` trained on ``topology``, from the trainer's batch ``batches``, when all ranks
    had trained ``items`` items of the order laid out for ``plan``, whose epoch has ``steps`` batches per rank."""

    epoch: int
    plan: Topology
    topology: Topology
    steps: int
    batches: int = 0
    items: int = 0

    @property
    def restriped(self) -> bool:
        """True when this stretch is litdata's restripe of the rest of the epoch, not its own layout."""
        return self.batches > 0 or self.plan != self.topology

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> Segment:
        return cls(
            epoch=int(state["epoch"]),
            plan=Topology(**state["plan"]),
            topology=Topology(**state["topology"]),
            steps=int(state["steps"]),
            batches=int(state["batches"]),
            items=int(state["items"]),
        )


def resume(
    saved: Segment | None, epoch: int, done: int, now: Topology, steps: int, images_per_item: int
) -> tuple[Segment, dict[str, Any] | None]:
    """The segment that starts at batch ``done`` of ``epoch`` on ``now`` (whose own epoch has ``steps`` batches per
    rank), and what litdata's dataset state needs to restripe the rest there (None: its own layout is exact).

    The restriped rest keeps the plan's steps: every rank gets as many batches, as many as the epoch had left.
    """
    if not done:
        return Segment(epoch, now, now, steps), None
    if saved is None or saved.epoch != epoch:  # a checkpoint without one: the epoch began on this topology
        saved = Segment(epoch, now, now, steps)
    if not saved.restriped and saved.topology == now:
        return saved, None
    if saved.topology.items_per_step != now.items_per_step:
        before, after = (t.items_per_step * images_per_item for t in (saved.topology, now))
        raise DataSettingError(
            f"the epoch resumes mid-way with {after} images per step over {now.world_size} ranks, but trained "
            f"{before} per step over {saved.topology.world_size}; set data.global_batch_size {before} (steps and "
            "images then stay as they were), or resume on the same ranks"
        )
    items = saved.items + (done - saved.batches) * saved.topology.items_per_step
    plan = saved.plan
    elastic = {
        "num_samples_yielded": 0,  # this topology's workers start afresh, after ``items`` of the order
        "sample_in_epoch": items,
        "resume_mode": "elastic",
        "initial_world_size": plan.world_size,
        "initial_num_nodes": plan.num_nodes,
        "initial_num_workers": plan.num_workers,
        "initial_batch_size": plan.items_per_batch,
        "num_canonical_nodes": plan.world_size,
    }
    return Segment(epoch, plan, now, saved.steps, done, items), elastic
