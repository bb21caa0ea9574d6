from types import SimpleNamespace

import pytest
import torch
from cifar_classifier.data import CifarDataModule

from classifier_engine.data.dataset import Positions
from classifier_engine.data.errors import DataError
from classifier_engine.runs.config_hash import canonical_config

from .conftest import DATASET

CPU = SimpleNamespace(root_device=torch.device("cpu"))


def fake_trainer(world_size=1, global_rank=0, batches_done=0, accumulate_grad_batches=1, **state):
    """The few trainer attributes the DataModule reads, without starting a Trainer.

    ``batches_done``: the batches of the current epoch a restored trainer says were trained already.
    """
    progress = SimpleNamespace(current=SimpleNamespace(ready=batches_done))
    fit_loop = SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress))
    state = {"training": False, "accumulate_grad_batches": accumulate_grad_batches, **state}
    return SimpleNamespace(world_size=world_size, global_rank=global_rank, strategy=CPU, fit_loop=fit_loop, **state)


def ready(data_dir, **kwargs):
    dm = CifarDataModule(data_dir=str(data_dir), verify_checksum=False, num_workers=0, **kwargs)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def test_train_batches_are_whole_uint8_batches(data_dir):
    dm = ready(data_dir, batch_size=16, val_size=32)
    images, labels, ids = next(iter(dm.train_dataloader()))
    assert images.shape == (16, 3, 32, 32) and images.dtype == torch.uint8
    assert labels.shape == (16,) and labels.dtype == torch.int64
    assert set(ids.tolist()) <= set(dm.train_set.indices.tolist())  # each image's row in the file
    assert len(dm.train_dataloader()) == (192 - 32) // 16


def test_validation_is_held_out_from_training(data_dir):
    dm = ready(data_dir, batch_size=16, val_size=32)
    train, val = set(dm.train_set.indices.tolist()), set(dm.val_set.indices.tolist())
    assert len(val) == 32 and not train & val and len(train | val) == 192
    assert sum(len(b[1]) for b in dm.val_dataloader()) == 32


def test_val_size_zero_validates_on_the_test_set(data_dir):
    dm = ready(data_dir, val_size=0, batch_size=16)
    assert dm.val_set is dm.test_set and len(dm.test_set) == 64


def test_workers_read_the_memory_map(data_dir):
    dm = CifarDataModule(data_dir=str(data_dir), verify_checksum=False, num_workers=2, batch_size=16, val_size=32)
    dm.prepare_data()
    dm.setup("fit")
    serial = CifarDataModule(data_dir=str(data_dir), verify_checksum=False, num_workers=0, batch_size=16, val_size=32)
    serial.setup("fit")
    parallel_labels = torch.cat([labels for _, labels in dm.val_dataloader()])
    serial_labels = torch.cat([labels for _, labels in serial.val_dataloader()])
    assert torch.equal(parallel_labels, serial_labels)


def test_a_rank_of_a_process_group_reads_through_workers_a_fork_server_started(data_dir):
    """Not forked from the rank: its process group's threads would make a fork deadlock now and then."""
    shards = []
    for workers in (2, 0):
        dm = CifarDataModule(data_dir=str(data_dir), verify_checksum=False, num_workers=workers, val_size=32)
        dm.trainer = fake_trainer(world_size=2, global_rank=1)
        dm.prepare_data()
        dm.setup("validate")
        loader = dm.val_dataloader()
        shards.append(torch.cat([images.flatten(1) for images, _ in loader]))
    assert loader.multiprocessing_context is None  # no workers: nothing to start
    dm.num_workers = 2
    assert dm.val_dataloader().multiprocessing_context.get_start_method() == "forkserver"
    assert torch.equal(shards[0], shards[1])
    single = CifarDataModule(data_dir=str(data_dir), verify_checksum=False, num_workers=2, val_size=32)
    single.setup("validate")
    assert single.val_dataloader().multiprocessing_context is None  # one process: forked, as usual


def test_names_and_classes_come_from_the_data():
    dm = CifarDataModule(dataset="cifar100")
    assert dm.num_classes == 100 and dm.class_names[:2] == ["apple", "aquarium_fish"]


def test_class_names_must_match_the_archive(data_dir):
    with pytest.raises(DataError, match=r"set data\.class_names"):
        ready(data_dir, class_names=[f"c{i}" for i in range(len(DATASET.class_names))])


def test_a_batch_larger_than_the_training_set_is_lowered_to_it(data_dir):
    data = ready(data_dir, batch_size=1000, val_size=32)  # 160 training images
    assert (data.batches.per_device, data.batches.eval_per_device) == (160, 160)
    assert len(data.train_dataloader()) == 1


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("batch_size", 0),
        ("val_size", -1),
        ("dataset", "mnist"),
        ("cutout", -2),
        ("flip", "sometimes"),
        ("storage", "disk"),
        ("crop_padding_mode", "wrap"),
    ],
)
def test_bad_arguments_are_refused(key, value):
    with pytest.raises(ValueError, match=f"data.{key}"):
        CifarDataModule(**{key: value})


@pytest.mark.parametrize(("devices", "accumulated", "per_device"), [(2, 1, 16), (2, 2, 8), (1, 4, 8)])
def test_global_batch_size_is_split_over_devices_and_accumulated_batches(data_dir, devices, accumulated, per_device):
    dm = CifarDataModule(
        data_dir=str(data_dir), verify_checksum=False, num_workers=0, val_size=32, global_batch_size=32
    )
    dm.trainer = fake_trainer(world_size=devices, global_rank=devices - 1, accumulate_grad_batches=accumulated)
    dm.prepare_data()
    dm.setup("fit")
    assert dm.batches.per_device == per_device and dm.batches.per_step == 32  # the setting is per optimizer step
    assert dm.train_dataloader().batch_size == per_device
    assert dm.val_dataloader().batch_size == per_device  # evaluation follows the training batch, not the default 512


def test_a_global_batch_that_does_not_divide_is_refused(data_dir):
    odd = CifarDataModule(
        data_dir=str(data_dir), verify_checksum=False, num_workers=0, val_size=32, global_batch_size=36
    )
    odd.trainer = fake_trainer(world_size=2, global_rank=1, accumulate_grad_batches=4)
    odd.prepare_data()
    with pytest.raises(DataError, match=r"data\.global_batch_size=36 does not divide over 2 devices x 4 accumulated"):
        odd.setup("fit")


def test_batch_size_is_out_of_the_runs_identity_when_global_batch_size_replaces_it():
    def config(batch_size: int, global_batch_size: int | None) -> dict:
        settings = {"batch_size": batch_size, "global_batch_size": global_batch_size}
        return {"data": {"class_path": "CifarDataModule", "init_args": settings}, "model": {}}

    assert canonical_config(config(512, 64)) == canonical_config(config(16, 64))
    assert canonical_config(config(16, None)) != canonical_config(config(32, None))


def test_distributed_evaluation_shards_are_disjoint_and_unpadded(data_dir):
    shards = []
    for rank in (0, 1):
        dm = CifarDataModule(
            data_dir=str(data_dir), verify_checksum=False, num_workers=0, val_size=31, eval_batch_size=8
        )
        dm.trainer = fake_trainer(world_size=2, global_rank=rank)
        dm.prepare_data()
        dm.setup("validate")
        shards.append([i for batch in dm.val_dataloader().batch_sampler for i in batch])
    assert len(shards[0]) + len(shards[1]) == 31  # 16 + 15: nothing repeated to even them out
    assert set(shards[0]) | set(shards[1]) == set(range(31))


def epoch_of_batches(storage, data_dir, epoch):
    """Every training batch of one epoch as the training step receives it (augmented), and the loader."""
    dm = CifarDataModule(
        data_dir=str(data_dir), verify_checksum=False, num_workers=0, batch_size=16, val_size=32,
        flip="alternating", crop_padding_mode="reflect", cutout=6, storage=storage,
    )  # fmt: skip
    dm.trainer = fake_trainer(training=True, current_epoch=epoch)
    dm.prepare_data()
    torch.manual_seed(3)
    dm.setup("fit")
    loader = dm.train_dataloader()
    loader.sampler.set_epoch(epoch)
    return [dm.on_after_batch_transfer(batch, 0) for batch in loader], loader, dm


@pytest.mark.parametrize("epoch", [0, 1])
def test_device_storage_trains_on_exactly_the_memory_mapped_batches(data_dir, epoch):
    resident, resident_loader, dm = epoch_of_batches("device", data_dir, epoch)
    mapped, _, _ = epoch_of_batches("memmap", data_dir, epoch)
    assert isinstance(next(iter(resident_loader)), Positions) and resident_loader.num_workers == 0
    assert dm.resident["train"].tensors[0].shape == (160, 3, 32, 32)
    assert dm.resident["val"] is not dm.resident["test"]
    assert len(resident) == len(mapped) == 10
    for (images, labels), (expected_images, expected_labels) in zip(resident, mapped, strict=True):
        assert torch.equal(images, expected_images) and torch.equal(labels, expected_labels)
    dm.trainer.training = False
    evaluated = [dm.on_after_batch_transfer(batch, 0) for batch in dm.val_dataloader()]
    expected = torch.from_numpy(dm.val_set.arrays[1][dm.val_set.indices])
    assert torch.equal(torch.cat([labels for _, labels in evaluated]), expected)


def test_auto_storage_memory_maps_off_the_gpu(data_dir):
    dm = CifarDataModule(data_dir=str(data_dir), verify_checksum=False, num_workers=2, batch_size=16, val_size=0)
    dm.trainer = fake_trainer()
    dm.prepare_data()
    dm.setup("fit")
    assert dm.resident == {} and dm.train_dataloader().num_workers == 2
    resident = CifarDataModule(
        data_dir=str(data_dir), verify_checksum=False, batch_size=16, val_size=0, storage="device"
    )
    resident.setup("fit")
    assert resident.resident["val"] is resident.resident["test"]  # copied once


def test_a_worker_loader_reads_its_order_at_the_first_batch_from_the_trainers_epoch(data_dir):
    # A resumed fit makes the iterator first, then moves to the epoch: the order must follow the move.
    dm = CifarDataModule(data_dir=str(data_dir), verify_checksum=False, num_workers=2, batch_size=16, val_size=32)
    dm.prepare_data()
    trainer = fake_trainer(current_epoch=0)
    dm.trainer = trainer
    dm.setup("fit")
    loader = dm.train_dataloader()
    expected = {}
    for epoch in (0, 1):
        trainer.current_epoch = epoch
        expected[epoch] = torch.cat([ids for _, _, ids in loader])
    assert not torch.equal(expected[0], expected[1])
    trainer.current_epoch = 0
    iterator = iter(loader)  # made during epoch 0 ...
    trainer.current_epoch = 1  # ... the epoch starts
    assert torch.equal(torch.cat([ids for _, _, ids in iterator]), expected[1])


@pytest.mark.slow  # loader workers start and stop for each loader
def test_making_and_reading_loaders_leaves_the_global_random_stream_alone(data_dir):
    dm = ready(data_dir, batch_size=16, val_size=32)
    before = torch.get_rng_state()
    for loader in (dm.train_dataloader(), dm.val_dataloader()):
        for _ in loader:
            pass
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_epoch_resumed_mid_way_serves_the_rest_of_the_same_order_and_then_whole_epochs(data_dir, num_workers):
    def epochs(batches_done: int) -> tuple[list[list[int]], int]:
        dm = CifarDataModule(data_dir=str(data_dir), verify_checksum=False, num_workers=num_workers,
                             batch_size=16, val_size=32)  # fmt: skip
        dm.trainer = fake_trainer(training=True, current_epoch=1, batches_done=batches_done)
        dm.prepare_data()
        dm.setup("fit")
        loader = dm.train_dataloader()
        first = [ids.tolist() for _, _, ids in loader]
        dm.trainer.fit_loop.epoch_loop.batch_progress.current.ready = 0  # the next epoch starts afresh
        dm.trainer.current_epoch = 2
        return [first, [ids.tolist() for _, _, ids in loader]], len(loader)

    (whole, following), length = epochs(0)
    (resumed, following_resumed), resumed_length = epochs(3)
    assert length == resumed_length == len(whole) == 10  # the epoch's length is the whole epoch's
    assert resumed == whole[3:] and following_resumed == following != whole
