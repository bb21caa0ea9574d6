"""Where a streamed epoch resumes: litdata's own replay on the same topology, its restripe on another."""

from __future__ import annotations

import pytest

from classifier_engine.data.errors import DataSettingError
from classifier_engine.data.streams.position import Segment, Topology, resume

TWO_RANKS = Topology(world_size=2, num_nodes=1, num_workers=2, items_per_batch=4)
ONE_RANK = Topology(world_size=1, num_nodes=1, num_workers=2, items_per_batch=8)


def test_a_fresh_epoch_and_a_resume_on_the_same_topology_leave_litdata_its_own_replay():
    assert resume(None, 3, 0, TWO_RANKS, 4, 2) == (Segment(3, TWO_RANKS, TWO_RANKS, steps=4), None)
    saved = Segment(3, TWO_RANKS, TWO_RANKS, steps=4)
    assert resume(saved, 3, 2, TWO_RANKS, 4, 2) == (saved, None)
    # A checkpoint without a segment (or one of another epoch): the epoch began on this topology.
    assert resume(Segment(2, ONE_RANK, ONE_RANK, steps=4), 3, 2, TWO_RANKS, 4, 2)[1] is None


def test_another_topology_restripes_after_every_item_all_ranks_trained_keeping_the_first_layout_s_steps():
    segment, elastic = resume(Segment(1, TWO_RANKS, TWO_RANKS, steps=4), 1, 2, ONE_RANK, 3, 2)
    # 2 steps x 2 ranks x 4 items trained; the epoch keeps its 4 steps, though one rank's own would have 3.
    assert segment == Segment(1, TWO_RANKS, ONE_RANK, steps=4, batches=2, items=16)
    assert elastic is not None and elastic["sample_in_epoch"] == 16 and elastic["resume_mode"] == "elastic"
    assert (elastic["initial_world_size"], elastic["initial_num_workers"], elastic["initial_batch_size"]) == (2, 2, 4)
    # Stopped again 1 step later and back on two ranks: still the first layout, 16 + 8 items in.
    segment, elastic = resume(segment, 1, 3, TWO_RANKS, 4, 2)
    assert segment == Segment(1, TWO_RANKS, TWO_RANKS, steps=4, batches=3, items=24)
    assert segment.restriped and elastic is not None and elastic["sample_in_epoch"] == 24


def test_another_number_of_images_per_step_is_refused_with_the_setting_that_keeps_it():
    halved = Topology(world_size=1, num_nodes=1, num_workers=2, items_per_batch=4)
    with pytest.raises(DataSettingError, match=r"set data\.global_batch_size 16"):
        resume(Segment(1, TWO_RANKS, TWO_RANKS, steps=4), 1, 2, halved, 8, 2)
