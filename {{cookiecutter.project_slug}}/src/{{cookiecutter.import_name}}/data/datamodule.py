"""CIFAR-10/100 as a LightningDataModule: memory-mapped uint8 batches, augmented on the device."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import lightning as L
import numpy as np
import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch import Tensor
from torch.utils.data import DataLoader, DistributedSampler

from .archive import Cache, DataError, load_cache, prepare
from .augment import BatchAugment
from .cifar_format import FORMATS
from .dataset import MemmapBatches, keep_batch


class CifarDataModule(L.LightningDataModule):
    """Serves CIFAR batches as uint8 (N, 3, 32, 32) tensors; the model normalizes them."""

    def __init__(
        self,
        dataset: Literal["cifar10", "cifar100"] = "{{ cookiecutter.dataset }}",
        data_dir: str = "data",
        batch_size: int = 512,
        global_batch_size: int | None = None,
        eval_batch_size: int | None = None,
        num_workers: int = 2,
        val_size: int = 5000,
        split_seed: int = 0,
        crop_padding: int = 4,
        flip: bool = True,
        cutout: int = 0,
        download: bool = True,
        verify_checksum: bool = True,
        class_names: list[str] | None = None,
        pin_memory: bool = True,
    ) -> None:
        """Configure the data.

        Args:
            dataset: Which archive to use; its official file name is looked for in ``data_dir``.
            data_dir: Folder holding the archive (downloaded there if absent) and its converted cache.
            batch_size: Training images per batch and per device (the global batch is this times the world size).
            global_batch_size: Training images per optimizer step over all devices; if set, it replaces
                batch_size, which becomes this divided by the number of devices (it must divide evenly).
            eval_batch_size: Images per validation/test/predict batch; defaults to ``batch_size``.
            num_workers: DataLoader worker processes gathering batches from the memory map.
            val_size: Training images held out for validation; 0 validates on the test set instead.
            split_seed: Seed of the fixed train/validation split (independent of the run's seed).
            crop_padding: Random-crop padding in pixels for training batches; 0 disables the crop.
            flip: Randomly mirror training images left to right.
            cutout: Side in pixels of a square zeroed at a random place in each training image; 0 disables it.
            download: Download the official archive when it is not in ``data_dir``.
            verify_checksum: Check the archive's MD5 against the official one; false to use your own CIFAR-format data.
            class_names: Class names of your own CIFAR-format data; defaults to the official names.
            pin_memory: Pin host batches for faster, asynchronous copies to the GPU.
        """
        super().__init__()
        # The model records the resolved class names; the data's unresolved default would clash with them.
        self.save_hyperparameters(ignore=["class_names"])
        if dataset not in FORMATS:
            raise ValueError(f"data.dataset must be one of {sorted(FORMATS)}, got {dataset!r}")
        sizes = (
            ("batch_size", batch_size),
            ("global_batch_size", global_batch_size or 1),
            ("eval_batch_size", eval_batch_size or 1),
        )
        for name, value in sizes:
            if value < 1:
                raise ValueError(f"data.{name} must be a positive integer, got {value}")
        if val_size < 0:
            raise ValueError(f"data.val_size must be 0 or more, got {val_size}")
        self.format = FORMATS[dataset]
        self.data_dir = Path(data_dir)
        self.batch_size = batch_size
        self.global_batch_size = global_batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self.val_size = val_size
        self.split_seed = split_seed
        self.download = download
        self.verify_checksum = verify_checksum
        self.pin_memory = pin_memory
        self.class_names = list(class_names or self.format.class_names)
        self.num_classes = len(self.class_names)
        self.mean = self.format.mean
        self.std = self.format.std
        if crop_padding < 0 or cutout < 0:
            raise ValueError(f"data.crop_padding and data.cutout must be 0 or more, got {crop_padding} and {cutout}")
        self.augment = BatchAugment(crop_padding=crop_padding, flip=flip, cutout=cutout)
        self.cache: Cache | None = None
        self.seed = 0

    def prepare_data(self) -> None:
        prepare(self.data_dir, self.format, download=self.download, verify_checksum=self.verify_checksum)

    def setup(self, stage: str) -> None:
        self.cache = load_cache(self.data_dir, self.format)
        if self.cache is None:
            raise DataError(f"no converted {self.format.title} data in {self.data_dir}; prepare_data() must run first")
        if list(self.cache.class_names) != self.class_names:
            raise DataError(
                f"the archive's class names {list(self.cache.class_names)} differ from data.class_names "
                f"{self.class_names}; set data.class_names to the archive's names"
            )
        train = self.cache.split("train")
        num_train = len(np.load(train.labels, mmap_mode="r"))
        if self.val_size >= num_train:
            raise DataError(f"data.val_size={self.val_size} leaves no training images (the archive has {num_train})")
        order = np.random.default_rng(self.split_seed).permutation(num_train)
        held_out, kept = np.sort(order[: self.val_size]), np.sort(order[self.val_size :])
        self.train_set = MemmapBatches(train.images, train.labels, kept)
        test = self.cache.split("test")
        self.test_set = MemmapBatches(test.images, test.labels)
        self.val_set = MemmapBatches(train.images, train.labels, held_out) if self.val_size else self.test_set
        world_size = self.trainer.world_size if self.trainer is not None else 1
        if self.global_batch_size is not None:
            if self.global_batch_size % world_size:
                raise DataError(
                    f"data.global_batch_size={self.global_batch_size} does not divide over {world_size} devices; "
                    f"use a multiple of {world_size}, or set data.batch_size per device instead"
                )
            self.batch_size = self.global_batch_size // world_size
        if stage == "fit" and len(self.train_set) < self.batch_size * world_size:
            raise DataError(
                f"data.batch_size={self.batch_size} per device x {world_size} devices is more than the "
                f"{len(self.train_set)} training images; lower data.batch_size"
            )
        rank = self.trainer.global_rank if self.trainer is not None else 0
        self.seed = torch.initial_seed()  # the run's seed (seed_everything)
        self.augment.seed(self.seed + rank)

    def _loader(self, dataset: MemmapBatches, batch_size: int, train: bool) -> DataLoader:
        world_size = self.trainer.world_size if self.trainer is not None else 1
        rank = self.trainer.global_rank if self.trainer is not None else 0
        if train:
            # The order of epoch e is a permutation drawn from (run seed, e) alone, sharded over the
            # ranks (disjoint, remainder dropped). It does not depend on how much of the global random
            # stream was used before, so a resumed run sees exactly the batches it would have seen.
            # Lightning keeps a DistributedSampler it is given and calls set_epoch on it every epoch.
            sampler = DistributedSampler(
                dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=self.seed, drop_last=True
            )
        elif world_size > 1:
            # Disjoint, unpadded shards: each image is evaluated exactly once over all ranks, so the
            # synchronized metrics equal a single-process evaluation (Lightning's default would pad).
            sampler = UnrepeatedDistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=False)
        else:
            sampler = None
        return DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            drop_last=train,
            num_workers=self.num_workers,
            collate_fn=keep_batch,
            pin_memory=self.pin_memory and torch.cuda.is_available(),
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, self.batch_size, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, self.eval_batch_size, train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, self.eval_batch_size, train=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, self.eval_batch_size, train=False)

    def state_dict(self) -> dict[str, Any]:
        """Checkpointed with the run: where the augmentation's random stream stands."""
        return {"augment_generator": self.augment.state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.augment.set_state(state_dict.get("augment_generator"))

    def on_after_batch_transfer(self, batch: tuple[Tensor, Tensor], dataloader_idx: int) -> tuple[Tensor, Tensor]:
        # Lightning also routes the model's example input (a bare tensor) through here: leave it be.
        if isinstance(batch, Tensor) or self.trainer is None or not self.trainer.training:
            return batch
        images, labels = batch
        return self.augment(images), labels
