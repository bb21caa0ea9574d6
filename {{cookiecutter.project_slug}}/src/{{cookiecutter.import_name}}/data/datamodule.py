"""CIFAR-10/100 as a LightningDataModule: uint8 batches (memory-mapped or device-resident), augmented on the device."""

from __future__ import annotations

import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import lightning as L
import numpy as np
import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch.utils.data import DataLoader
from typing_extensions import override

from ..machinery.errors import check_choice
from .archive import Cache, fingerprint, load_cache, prepare
from .augment import BatchAugment, FlipMode, PaddingMode
from .batches import BatchSizes
from .cifar_format import FORMATS
from .dataset import MemmapBatches, Positions, ResidentBatches, TensorBatches, keep_batch
from .errors import DataError, DataSettingError
from .image_folder import load_image_folder
from .loader import FirstBatchStartLoader, TrainerEpochSampler

Storage = Literal["auto", "device", "memmap"]
# "auto" keeps the data on a GPU when it takes at most this share of the GPU's free memory.
RESIDENT_SHARE_OF_FREE_MEMORY = 0.25


def leave_signals_to_the_main_process(worker_id: int) -> None:
    """A loader worker ignores Ctrl-C and SIGUSR1/2, which a terminal or a scheduler sends to every process.

    The main process stops at a batch boundary (``StopOnSignal``) and ends its workers itself; a
    worker killed by the signal would fail the validation that may still run before the stop.
    SIGTERM keeps its default: it is how the loader (and multiprocessing at exit) ends a worker.
    """
    for number in (signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(number, signal.SIG_IGN)


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
        crop_padding_mode: PaddingMode = "zeros",
        flip: FlipMode = "random",
        cutout: int = 0,
        storage: Storage = "auto",
        download: bool = True,
        verify_checksum: bool = True,
        class_names: list[str] | None = None,
        pin_memory: bool = True,
        predict_dir: str | None = None,
    ) -> None:
        """Configure the data.

        Args:
            dataset: Which archive to use; its official file name is looked for in ``data_dir``.
            data_dir: Folder holding the archive (downloaded there if absent) and its converted cache.
            batch_size: Training images per batch and per device (an optimizer step takes this x devices x
                trainer.accumulate_grad_batches); ignored when global_batch_size is set.
            global_batch_size: Training images per optimizer step over all devices and accumulated batches;
                replaces batch_size (per device: this / devices / accumulate_grad_batches, which must divide).
            eval_batch_size: Images per validation/test/predict batch and device; defaults to the training
                batch per device.
            num_workers: DataLoader worker processes gathering batches from the memory map.
            val_size: Training images held out for validation; 0 validates on the test set instead.
            split_seed: Seed of the fixed train/validation split (independent of the run's seed).
            crop_padding: Random-crop padding in pixels for training batches; 0 disables the crop.
            crop_padding_mode: What the crop shows beyond the border: zeros, or a reflection of the image.
            flip: Left-right mirroring of training images: random (each image, each epoch), alternating
                (each image in a fixed random orientation, mirrored on odd epochs) or none.
            cutout: Side in pixels of a square zeroed at a random place in each training image; 0 disables it.
            storage: Where the images live: device (copied once to the accelerator; batches are gathered
                there, no workers), memmap (memory-mapped, gathered by workers), or auto (device on a GPU
                with room to spare, else memmap).
            download: Download the official archive when it is not in ``data_dir``.
            verify_checksum: Check the archive's MD5 against the official one; false to use your own CIFAR-format data.
            class_names: Class names of your own CIFAR-format data; defaults to the official names.
            pin_memory: Pin host batches for faster, asynchronous copies to the GPU.
            predict_dir: Folder of your own images (PNG, JPEG, ...; resized to 32x32) for ``predict``;
                by default ``predict`` runs on the test split.
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
        self.eval_batch_size = eval_batch_size
        self.batches: BatchSizes | None = None  # derived in setup(), once the devices and the accumulation are known
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
        check_choice("data.storage", storage, Storage)
        self.storage = storage
        self.augment = BatchAugment(crop_padding, flip, cutout, crop_padding_mode)
        self.predict_dir = Path(predict_dir) if predict_dir else None
        self.cache: Cache | None = None
        self.resident: dict[str, ResidentBatches] = {}
        self.seed = 0
        self.predict_set: MemmapBatches | TensorBatches | None = None
        self.predict_names: list[str] = []  # the files of predict_dir; test-set images go by their index

    @classmethod
    def data_fingerprint(cls, settings: Mapping[str, Any], stage: str) -> str:
        """The dataset's name and its archive's MD5; for ``predict`` on your own images, their folder.

        Checked before anything is built: data that is neither here nor to be downloaded is refused at once.
        """
        if stage == "predict" and settings.get("predict_dir"):
            return f"images:{settings['predict_dir']}"  # no CIFAR archive is needed, or looked for
        return fingerprint(
            Path(settings["data_dir"]),
            FORMATS[settings["dataset"]],
            download=settings["download"],
            verify_checksum=settings["verify_checksum"],
        )

    def _predicting_own_images(self) -> bool:
        return self.predict_dir is not None and self.trainer is not None and self.trainer.predicting

    @override
    def prepare_data(self) -> None:
        if not self._predicting_own_images():  # your own images need no archive
            prepare(self.data_dir, self.format, download=self.download, verify_checksum=self.verify_checksum)

    @override
    def setup(self, stage: str) -> None:
        if stage == "predict" and self.predict_dir is not None:
            self._derive_batch_sizes()
            images, self.predict_names = load_image_folder(self.predict_dir)
            self.predict_set = TensorBatches(images)
            self.seed = torch.initial_seed()
            return
        self.cache = load_cache(self.data_dir, self.format)
        if self.cache is None:
            raise DataError(f"no converted {self.format.title} data in {self.data_dir}; prepare_data() must run first")
        if list(self.cache.class_names) != self.class_names:
            raise DataSettingError(
                f"the archive's class names {list(self.cache.class_names)} differ from data.class_names "
                f"{self.class_names}; set data.class_names to the archive's names"
            )
        train = self.cache.split("train")
        num_train = len(np.load(train.labels, mmap_mode="r"))
        if self.val_size >= num_train:
            raise DataSettingError(
                f"data.val_size={self.val_size} leaves no training images (the archive has {num_train}); "
                f"set data.val_size below {num_train}, or to 0 to validate on the test set"
            )
        order = np.random.default_rng(self.split_seed).permutation(num_train)
        held_out, kept = np.sort(order[: self.val_size]), np.sort(order[self.val_size :])
        self.train_set = MemmapBatches(train.images, train.labels, kept, with_ids=True)
        test = self.cache.split("test")
        self.test_set = MemmapBatches(test.images, test.labels)
        self.val_set = MemmapBatches(train.images, train.labels, held_out) if self.val_size else self.test_set
        self.predict_set = self.test_set
        self.predict_names = []  # test-set images are named by their index (predict_name)
        batches = self._derive_batch_sizes()
        if stage == "fit" and len(self.train_set) < batches.per_device * batches.devices:
            knob = "data.global_batch_size" if self.global_batch_size is not None else "data.batch_size"
            raise DataSettingError(
                f"a batch of {batches.per_device} per device x {batches.devices} devices is more than the "
                f"{len(self.train_set)} training images; lower {knob}"
            )
        rank = self.trainer.global_rank if self.trainer is not None else 0
        self.seed = torch.initial_seed()  # the run's seed (seed_everything)
        self.augment.seed(self.seed + rank, image_seed=self.seed)
        self._place_splits()

    def _derive_batch_sizes(self) -> BatchSizes:
        """The batch sizes for this trainer's devices and gradient accumulation (``data/batches.py``)."""
        trainer = self.trainer
        self.batches = BatchSizes.derive(
            self.batch_size,
            self.global_batch_size,
            self.eval_batch_size,
            devices=trainer.world_size if trainer is not None else 1,
            accumulated=trainer.accumulate_grad_batches if trainer is not None else 1,
        )
        return self.batches

    def _place_splits(self) -> None:
        """Copy the splits to the accelerator when ``storage`` says so (once: setup runs per stage)."""
        device = self.trainer.strategy.root_device if self.trainer is not None else torch.device("cpu")
        if not self._keep_on(device):
            self.resident = {}
            return
        if self.resident and next(iter(self.resident.values())).tensors[0].device == device:
            return
        copies: dict[int, ResidentBatches] = {}  # validation may be the test split: copy it once
        for name, split in self._splits().items():
            if id(split) not in copies:
                copies[id(split)] = ResidentBatches(name, split, device)
            self.resident[name] = copies[id(split)]
        megabytes = sum(split.nbytes for split in copies.values()) / 2**20
        rank_zero_info(f"Data: {self.format.title} resident on {device} ({megabytes:.0f} MB); no loader workers")

    def _keep_on(self, device: torch.device) -> bool:
        if self.storage != "auto":
            return self.storage == "device"
        if device.type != "cuda":
            return False
        needed = sum(array.nbytes for array in self.train_set.arrays)
        return needed <= RESIDENT_SHARE_OF_FREE_MEMORY * torch.cuda.mem_get_info(device)[0]

    def _splits(self) -> dict[str, MemmapBatches | TensorBatches]:
        if self.cache is None:  # only your own images, for predict
            return {"predict": self.predict_set}
        return {"train": self.train_set, "val": self.val_set, "test": self.test_set, "predict": self.predict_set}

    @property
    def validates_on_test_set(self) -> bool:
        return self.val_size == 0

    def predict_name(self, index: int) -> str:
        return self.predict_names[index] if index < len(self.predict_names) else str(index)

    def train_images(self, count: int) -> Tensor:
        """The first ``count`` training images (uint8, on the CPU), in their fixed order: for fitting layers to data."""
        if self.cache is None:
            raise DataError("train_images() needs setup() to have run")
        return self.train_set.__getitems__(range(min(count, len(self.train_set))))[0]

    def _sizes(self) -> BatchSizes:
        if self.batches is None:
            raise DataError("the loaders need setup() to have run")
        return self.batches

    def _loader(self, split: str, batch_size: int, train: bool) -> DataLoader:
        memmapped = self._splits()[split]
        dataset = self.resident.get(split, memmapped)
        workers = 0 if self.resident else self.num_workers
        world_size = self.trainer.world_size if self.trainer is not None else 1
        rank = self.trainer.global_rank if self.trainer is not None else 0
        if train:
            # The order of epoch e is a permutation drawn from (run seed, e) alone, sharded over the
            # ranks (disjoint, remainder dropped). It does not depend on how much of the global random
            # stream was used before, so a resumed run sees exactly the batches it would have seen.
            # Lightning keeps a DistributedSampler it is given (the epoch comes from the trainer: see loader.py).
            sampler = TrainerEpochSampler(
                memmapped,
                self._current_epoch,
                num_replicas=world_size,
                rank=rank,
                shuffle=True,
                seed=self.seed,
                drop_last=True,
            )
        elif world_size > 1:
            # Disjoint, unpadded shards: each image is evaluated exactly once over all ranks, so the
            # synchronized metrics equal a single-process evaluation (Lightning's default would pad).
            sampler = UnrepeatedDistributedSampler(memmapped, num_replicas=world_size, rank=rank, shuffle=False)
        else:
            sampler = None
        return FirstBatchStartLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            # The loader draws its workers' base seed when an iterator is created; from its own
            # generator, that draw leaves the global random stream (dropout, a user's code) alone.
            generator=torch.Generator().manual_seed(self.seed),
            drop_last=train,
            num_workers=workers,
            collate_fn=keep_batch,
            pin_memory=self.pin_memory and not self.resident and torch.cuda.is_available(),
            persistent_workers=workers > 0,
            worker_init_fn=leave_signals_to_the_main_process if workers > 0 else None,
            batches_done=self._batches_done if train else lambda: 0,
        )

    def _current_epoch(self) -> int | None:
        return self.trainer.current_epoch if self.trainer is not None else None

    def _batches_done(self) -> int:
        """Batches of the current epoch trained before a mid-epoch resume (the trainer's restored progress), else 0."""
        if self.trainer is None or not self.trainer.training:
            return 0
        done = self.trainer.fit_loop.epoch_loop.batch_progress.current.ready
        self.augment.resume_at(self.trainer.current_epoch, done)  # its random draws skip those batches too
        return done

    @override
    def train_dataloader(self) -> DataLoader:
        return self._loader("train", self._sizes().per_device, train=True)

    @override
    def val_dataloader(self) -> DataLoader:
        return self._loader("val", self._sizes().eval_per_device, train=False)

    @override
    def test_dataloader(self) -> DataLoader:
        return self._loader("test", self._sizes().eval_per_device, train=False)

    @override
    def predict_dataloader(self) -> DataLoader:
        return self._loader("predict", self._sizes().eval_per_device, train=False)

    @override
    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        # Lightning also routes the model's example input (a bare tensor) through here: leave it be.
        if isinstance(batch, Tensor):
            return batch
        if isinstance(batch, Positions):
            batch = self.resident[batch.split].gather(batch.positions)
        images, labels, *ids = batch
        if self.trainer is not None and self.trainer.training:
            epoch = self.trainer.current_epoch
            images = self.augment(images, ids[0] if ids else None, epoch)
        return images, labels
