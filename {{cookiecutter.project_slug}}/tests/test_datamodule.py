from types import SimpleNamespace

import pytest
import torch

from {{ cookiecutter.import_name }}.data import CifarDataModule
from {{ cookiecutter.import_name }}.data.archive import DataError

from .conftest import DATASET


def ready(data_dir, **kwargs):
    dm = CifarDataModule(data_dir=str(data_dir), verify_checksum=False, num_workers=0, **kwargs)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def test_train_batches_are_whole_uint8_batches(data_dir):
    dm = ready(data_dir, batch_size=16, val_size=32)
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (16, 3, 32, 32) and images.dtype == torch.uint8
    assert labels.shape == (16,) and labels.dtype == torch.int64
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


def test_names_and_classes_come_from_the_data():
    dm = CifarDataModule(dataset="cifar100")
    assert dm.num_classes == 100 and dm.class_names[:2] == ["apple", "aquarium_fish"]


def test_class_names_must_match_the_archive(data_dir):
    with pytest.raises(DataError, match=r"set data\.class_names"):
        ready(data_dir, class_names=[f"c{i}" for i in range(len(DATASET.class_names))])


def test_batch_larger_than_the_training_set_is_refused(data_dir):
    with pytest.raises(DataError, match=r"lower data\.batch_size"):
        ready(data_dir, batch_size=1000, val_size=32)


@pytest.mark.parametrize(("key", "value"), [("batch_size", 0), ("val_size", -1), ("dataset", "mnist"), ("cutout", -2)])
def test_bad_arguments_are_refused(key, value):
    with pytest.raises(ValueError, match=f"data.{key}"):
        CifarDataModule(**{key: value})


def test_global_batch_size_is_split_over_devices_or_refused(data_dir):
    two_devices = SimpleNamespace(world_size=2, global_rank=1)
    dm = CifarDataModule(
        data_dir=str(data_dir), verify_checksum=False, num_workers=0, val_size=32, global_batch_size=32
    )
    dm.trainer = two_devices
    dm.prepare_data()
    dm.setup("fit")
    assert dm.batch_size == 16
    odd = CifarDataModule(
        data_dir=str(data_dir), verify_checksum=False, num_workers=0, val_size=32, global_batch_size=33
    )
    odd.trainer = two_devices
    with pytest.raises(DataError, match=r"data\.global_batch_size=33 does not divide over 2 devices"):
        odd.setup("fit")


def test_distributed_evaluation_shards_are_disjoint_and_unpadded(data_dir):
    shards = []
    for rank in (0, 1):
        dm = CifarDataModule(
            data_dir=str(data_dir), verify_checksum=False, num_workers=0, val_size=31, eval_batch_size=8
        )
        dm.trainer = SimpleNamespace(world_size=2, global_rank=rank)
        dm.prepare_data()
        dm.setup("validate")
        shards.append([i for batch in dm.val_dataloader().batch_sampler for i in batch])
    assert len(shards[0]) + len(shards[1]) == 31  # 16 + 15: nothing repeated to even them out
    assert set(shards[0]) | set(shards[1]) == set(range(31))
