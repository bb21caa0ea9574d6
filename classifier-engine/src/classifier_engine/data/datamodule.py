"""The fast path every dataset shares: uint8 batches (memory-mapped or device-resident), augmented on the device.

A dataset's module (``cifar.py``, ``folder.py``) only finds its images and packs them once into
memory-mappable arrays; ``ImageDataModule`` serves them: the batch sizes for the devices, the
exact-resume training order, disjoint shards under DDP, the copy to the GPU when it fits, and
the augmentation of whole batches where they already are.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import lightning as L
import numpy as np
import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from torch import Tensor
from torch.utils.data import DataLoader
from typing_extensions import override

from ..foundation.errors import check_choice
from ..foundation.process_lifetime import start_worker, worker_context
from .augment import AugmentSettings, BatchAugment, FlipMode, PaddingMode
from .batches import BatchSizes
from .dataset import (
    MemmapBatches,
    Positions,
    ResidentBatches,
    TensorBatches,
    cross_validation_folds,
    keep_batch,
)
from .errors import DataError, DataSettingError
from .folder_size import MIXUP_FROM_IMAGES, batch_for, counted, cutmix_for, mixup_for
from .folds import strata
from .image_files import IMAGE_SUFFIXES, BadImageError, Interpolation, Resize, centre_crop, decode_image, is_image_file
from .interfaces import HeldOutImages
from .loader import BalancedEpochSampler, FirstBatchStartLoader, TrainerEpochSampler
from .preprocessing import Preprocessing

log = logging.getLogger(__name__)

Storage = Literal["auto", "device", "memmap"]
Sampler = Literal["shuffle", "balanced"]
# "auto" keeps the data on a GPU when it takes at most this share of the GPU's free memory.
RESIDENT_SHARE_OF_FREE_MEMORY = 0.25
# From this size up, a random-resized crop replaces the padded shift crop unless the config says otherwise.
RESIZED_CROP_FROM = 64


def balanced_weights(labels: np.ndarray) -> Tensor:
    """Per image, one over its class's count (multi-label: its rarest class's), so each class is drawn as often."""
    groups = strata(np.asarray(labels))
    counts = np.bincount(groups)
    return torch.from_numpy(1.0 / counts[groups])


class ImageDataModule(L.LightningDataModule):
    """Serves uint8 (N, 3, S, S) batches of packed images; the model normalizes them.

    A subclass sets ``class_names``, ``image_size``, ``mean``, ``std`` and ``resize`` in its
    constructor and, in ``setup``, hands its splits to ``serve``.
    """

    def __init__(
        self,
        batch_size: int | None = 512,
        global_batch_size: int | None = None,
        eval_batch_size: int | None = None,
        num_workers: int = 2,
        crop_padding: int | None = None,
        crop_padding_mode: PaddingMode = "zeros",
        random_resized_crop: bool | None = None,
        resized_crop_scale: tuple[float, float] = (0.35, 1.0),
        flip: FlipMode = "random",
        cutout: int = 0,
        mixup_alpha: float | None = 0.0,
        cutmix_alpha: float | None = 0.0,
        folds: int = 0,
        fold: int | None = 0,
        storage: Storage = "auto",
        pin_memory: bool = True,
        predict_dir: str | None = None,
        sampler: Sampler = "shuffle",
    ) -> None:
        """Configure how batches are served and augmented.

        Args:
            batch_size: Training images per batch and per device (an optimizer step takes this x devices x
                trainer.accumulate_grad_batches); ignored when global_batch_size is set; null: from the number of
                training images, per optimizer step (16 below 1,000, 32 below 10,000, else 64: data/folder_size.py).
            global_batch_size: Training images per optimizer step over all devices and accumulated batches;
                replaces batch_size (per device: this / devices / accumulate_grad_batches, which must divide).
            eval_batch_size: Images per validation/test/predict batch and device; defaults to the training
                batch per device.
            num_workers: DataLoader worker processes gathering batches from the memory map.
            crop_padding: Random-crop padding in pixels for training batches (default: an eighth of the image
                size, 4 at 32 px; 0 when the random-resized crop is on); 0 disables the crop.
            crop_padding_mode: What the crop shows beyond the border: zeros, or a reflection of the image.
            random_resized_crop: Train on a random part of each image (area share in resized_crop_scale, aspect
                3/4 to 4/3) scaled back to full size; default: on from 64 px up, off below.
            resized_crop_scale: Smallest and largest area share of the random-resized crop.
            flip: Left-right mirroring of training images: random (each image, each epoch), alternating
                (each image in a fixed random orientation, mirrored on odd epochs) or none.
            cutout: Side in pixels of a square zeroed at a random place in each training image; 0 disables it.
            mixup_alpha: MixUp: each training image blended with another, labels in the same shares drawn from
                Beta(alpha, alpha) (0.2 is a common start); 0 disables it; null: 0.2 from 20,000 training images, off
                below.
            cutmix_alpha: CutMix: a box of another training image pasted in, labels by area, from Beta(alpha,
                alpha) (1.0 is the usual); 0 disables it; null: 1.0 from 20,000 training images, off below. With
                both on, each batch gets one of the two.
            folds: Cross-validation: deal the training images into this many stratified folds (a group's images
                into one), train on all but fold ``fold`` and validate on it (cross_validate.py runs each); 0: off.
            fold: Which fold (counted from 0) is held out for validation when ``folds`` is set; null: none, every
                fold trains and nothing is validated (the final model of cross_validate.py --final all).
            storage: Where the images live: device (copied once to the accelerator; batches are gathered
                there, no workers), memmap (memory-mapped, gathered by workers), or auto (device on a GPU
                with room to spare, else memmap).
            pin_memory: Pin host batches for faster, asynchronous copies to the GPU.
            predict_dir: Folder of your own images (PNG, JPEG, ...; resized as the training images were) for
                ``predict``; by default ``predict`` runs on the test split.
            sampler: Training order: shuffle (every image once an epoch) or balanced (images drawn with
                replacement so that each class comes equally often; multi-label: by each image's rarest class).
        """
        super().__init__()
        # The settings of this class and of the dataset's subclass, as the checkpoint and HPARAMS record them.
        # The model records the resolved class names, normalization and task; a data class's unresolved defaults
        # (null: the network's, or ImageNet's) would clash with them.
        self.save_hyperparameters(ignore=["class_names", "mean", "std", "task"])
        sizes = (
            ("batch_size", 1 if batch_size is None else batch_size),
            ("global_batch_size", global_batch_size or 1),
            ("eval_batch_size", eval_batch_size or 1),
        )
        for name, value in sizes:
            if value < 1:
                raise ValueError(f"data.{name} must be a positive integer, got {value}")
        if (crop_padding or 0) < 0 or cutout < 0:
            raise ValueError(f"data.crop_padding and data.cutout must be 0 or more, got {crop_padding} and {cutout}")
        low, high = resized_crop_scale
        if not 0 < low <= high <= 1:
            raise ValueError(
                f"data.resized_crop_scale must be two shares 0 < low <= high <= 1, got {resized_crop_scale}"
            )
        check_choice("data.storage", storage, Storage)
        check_choice("data.sampler", sampler, Sampler)
        self.sampler = sampler
        if folds and not (folds >= 2 and (fold is None or 0 <= fold < folds)):
            raise ValueError(
                f"data.folds must be 0 (off) or at least 2, with 0 <= data.fold < folds (or null); got {folds}, {fold}"
            )
        self.folds, self.fold = folds, fold
        self.batch_size = batch_size
        self.global_batch_size = global_batch_size
        self.eval_batch_size = eval_batch_size
        self.batches: BatchSizes | None = None  # derived in setup(), once the devices and the accumulation are known
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.storage = storage
        self.augment_settings = AugmentSettings(
            crop_padding,
            crop_padding_mode,
            random_resized_crop,
            tuple(resized_crop_scale),
            flip,
            cutout,
            mixup_alpha,
            cutmix_alpha,
        )
        # Checks the choices now; sized (and given the class count) in setup().
        self.augment = BatchAugment(
            0, flip, cutout, crop_padding_mode, mixup_alpha=mixup_alpha or 0.0, cutmix_alpha=cutmix_alpha or 0.0
        )
        # What the settings left null became for this training split (set in serve(): folder_size.py's rules).
        self.chosen: dict[str, float] = {}
        self.predict_dir = Path(predict_dir) if predict_dir else None
        self.resident: dict[str, ResidentBatches] = {}
        self.seed = 0
        self.train_set: MemmapBatches | None = None
        self.val_set: MemmapBatches | None = None
        self.test_set: MemmapBatches | None = None
        self.predict_set: MemmapBatches | TensorBatches | None = None
        self.predict_names: list[str] = []  # the files of predict_dir; test-set images go by their index
        # What a subclass sets in its constructor (the model's linked settings read them).
        self.class_names: list[str] = []
        self.image_size = 32
        self.mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
        self.std: tuple[float, float, float] = (0.25, 0.25, 0.25)
        self.resize: Resize = "crop"
        self.interpolation: Interpolation = "bilinear"  # how images are resized (as pretrained weights expect)
        self.crop_pct = 1.0  # the share of the shorter side a crop keeps
        # True where nothing may be fetched (export.py reads the run's data as it is); a subclass that can download
        # its data (CIFAR's archive) checks it in prepare_data.
        self.offline = False
        self.class_counts: list[int] | None = None  # training images per class, when known before packing
        self.task = "multiclass"  # or "multilabel": labels are (N, classes) rows of 0/1
        self.images_counted: int | None = None  # the training images class_counts counts
        self.title = "images"  # how the data is named in messages

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def sized_augmentation(self) -> BatchAugment:
        """The augmentation for this dataset's image size (crop padding and the resized crop follow the size)."""
        given = self.augment_settings
        mixup = given.mixup_alpha if given.mixup_alpha is not None else self.chosen.get("mixup_alpha", 0.0)
        cutmix = given.cutmix_alpha if given.cutmix_alpha is not None else self.chosen.get("cutmix_alpha", 0.0)
        resized = given.random_resized_crop
        if resized is None:
            resized = self.image_size >= RESIZED_CROP_FROM
        padding = given.crop_padding
        if padding is None:
            padding = 0 if resized else max(1, self.image_size // 8)
        return BatchAugment(
            padding,
            given.flip,
            given.cutout,
            given.crop_padding_mode,
            resized_crop_scale=given.resized_crop_scale if resized else None,
            mixup_alpha=mixup,
            cutmix_alpha=cutmix,
            num_classes=self.num_classes,
            output_size=self.image_size,
        )

    def preprocessing(self) -> Preprocessing:
        """How this DataModule makes an image the network's input: the record every checkpoint keeps."""
        return Preprocessing(
            self.image_size, self.resize, self.interpolation, float(self.crop_pct), tuple(self.mean), tuple(self.std)
        )

    def data_summary(self) -> str | None:
        """How many images each split has, of how many classes, at what size, from where."""
        if self.train_set is None or self.val_set is None:
            return None
        return (
            f"{len(self.train_set):,} training and {len(self.val_set):,} validation images of {self.num_classes} "
            f"classes at {self.image_size} px ({self.title})"
        )

    def predicting_own_images(self) -> bool:
        """Whether ``predict`` runs on ``predict_dir`` (then a subclass needs none of its own data)."""
        return self.predict_dir is not None and self.trainer is not None and self.trainer.predicting

    def setup_own_predictions(self) -> None:
        """``predict`` on ``predict_dir``: its images, resized by the training images' rule."""
        self._derive_batch_sizes()
        rule = (self.image_size, self.resize, self.interpolation, self.crop_pct)
        images, self.predict_names = load_image_folder(self.predict_dir, *rule)
        self.predict_set = TensorBatches(images)
        self.seed = torch.initial_seed()

    def fold_groups(self, split: MemmapBatches) -> np.ndarray | None:
        """Each image's group, kept in one fold by ``data.folds`` (a subclass that knows subjects or sessions says
        so); None: every image is its own."""
        return None

    def serve(self, stage: str, train: MemmapBatches, val: MemmapBatches, test: MemmapBatches) -> None:
        """Take the dataset's splits and get ready to serve them (called by a subclass's ``setup``)."""
        if self.folds:  # the fold replaces the validation split; the test split stays as it is
            seed = getattr(self, "split_seed", 0)
            train, val = cross_validation_folds(train, self.folds, self.fold, seed, self.fold_groups(train))
            test = test if len(test) else val  # no test split (it was the validation's, none now): the fold
        self.train_set, self.val_set, self.test_set = train, val, test
        self.predict_set = test
        self.predict_names = []  # test-set images are named by their index (predict_name)
        self.chosen = self.choices_for(len(train))
        batches = self._derive_batch_sizes()
        if stage == "fit" and len(train) < batches.per_device * batches.devices:
            self._fit_batch_to(len(train), batches)
        rank = self.trainer.global_rank if self.trainer is not None else 0
        self.seed = torch.initial_seed()  # the run's seed (seed_everything)
        self.augment = self.sized_augmentation()
        self.augment.seed(self.seed + rank, image_seed=self.seed)
        self._place_splits()

    def choices_for(self, training_images: int) -> dict[str, float]:
        """What each setting left null becomes for ``training_images`` images (``folder_size.py``'s rules)."""
        mixup, cutmix = self.augment_settings.mixup_alpha, self.augment_settings.cutmix_alpha
        rules = (
            ("batch_size", self.batch_size is None and self.global_batch_size is None, batch_for),
            ("mixup_alpha", mixup is None, mixup_for),
            ("cutmix_alpha", cutmix is None, cutmix_for),
        )
        return {name: rule(training_images) for name, left_null, rule in rules if left_null}

    def describe_choices(self) -> list[str]:
        """The batch and the mixing of this run in words, each marked "(as set)" where the config gave it."""
        if self.train_set is None or self.batches is None:
            return []
        steps = len(self.train_set) // self.batches.per_step
        batches, detail = self.batches, []
        if batches.devices > 1 or batches.accumulated > 1:
            detail.append(batches.describe().split(" = ")[0])  # "4 per device x 2 devices"
        if "batch_size" not in self.chosen:
            detail.append("as set")
        detail.append(f"{counted(steps, 'step')} an epoch")
        words = [f"batch {batches.per_step} ({'; '.join(detail)})"]
        mixup, cutmix = self.augment.mixup_alpha, self.augment.cutmix_alpha
        automatic = {"mixup_alpha", "cutmix_alpha"} & set(self.chosen)
        if mixup or cutmix:
            mixing = " and ".join(f"{name} {alpha}" for name, alpha in (("MixUp", mixup), ("CutMix", cutmix)) if alpha)
        else:
            mixing = "no MixUp"
        if not automatic:
            words.append(f"{mixing} (as set)")
        elif mixup or cutmix:
            words.append(f"{mixing} from {MIXUP_FROM_IMAGES:,} images")
        else:
            words.append(f"{mixing} below {MIXUP_FROM_IMAGES:,} images")
        return words

    def _derive_batch_sizes(self) -> BatchSizes:
        """The batch sizes for this trainer's devices and gradient accumulation (``data/batches.py``)."""
        trainer = self.trainer
        devices = trainer.world_size if trainer is not None else 1
        accumulated = trainer.accumulate_grad_batches if trainer is not None else 1
        batch = self.batch_size
        if batch is None:  # the rule's batch is per optimizer step, so the steps an epoch do not depend on the devices
            batch = max(1, self.chosen.get("batch_size", batch_for(0)) // (devices * accumulated))
            batch = max(self.batch_multiple, batch // self.batch_multiple * self.batch_multiple)
        self.batches = BatchSizes.derive(
            batch, self.global_batch_size, self.eval_batch_size, devices=devices, accumulated=accumulated
        )
        return self.batches

    @property
    def batch_multiple(self) -> int:
        """What every training batch per device is a multiple of (a store of several images per item: that many)."""
        return 1

    def _fit_batch_to(self, images: int, batches: BatchSizes) -> None:
        """A training split smaller than one batch on every device (a small folder of photos) trains on all of it.

        The batch per device is lowered to what the split holds (the evaluation batch with it, unless
        data.eval_batch_size is set), with a line saying so; a split too small for one image per device is refused.
        """
        fitted = images // batches.devices // self.batch_multiple * self.batch_multiple
        if fitted < 1:
            raise DataSettingError(
                f"{images} training images cannot give each of {batches.devices} devices one; add images or use "
                "fewer devices"
            )
        knob = "data.global_batch_size" if self.global_batch_size is not None else "data.batch_size"
        evaluation = batches.eval_per_device if self.eval_batch_size is not None else fitted
        self.batches = replace(batches, per_device=fitted, eval_per_device=evaluation)
        rank_zero_info(
            f"Data: a batch of {batches.per_device} per device x {batches.devices} devices is more than the {images} "
            f"training images; training with {fitted} per device instead ({knob} sets it)"
        )

    def _place_splits(self) -> None:
        """Copy the splits to the accelerator when ``storage`` says so (once: setup runs per stage)."""
        device = self.trainer.strategy.root_device if self.trainer is not None else torch.device("cpu")
        if not self.keeps_on(device):
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
        rank_zero_info(f"Data: {self.title} resident on {device} ({megabytes:.0f} MB); no loader workers")

    def keeps_on(self, device: torch.device) -> bool:
        """Whether the training images move to ``device`` once (``data.storage``; auto: a GPU with room to spare).

        A subclass whose images cannot live on the device (streamed ones) answers False.
        """
        if self.storage != "auto":
            return self.storage == "device"
        if device.type != "cuda":
            return False
        needed = sum(array.nbytes for array in self.train_set.arrays)
        return needed <= RESIDENT_SHARE_OF_FREE_MEMORY * torch.cuda.mem_get_info(device)[0]

    def _splits(self) -> dict[str, MemmapBatches | TensorBatches]:
        if self.train_set is None:  # only your own images, for predict
            return {"predict": self.predict_set}
        return {"train": self.train_set, "val": self.val_set, "test": self.test_set, "predict": self.predict_set}

    @property
    def validates_on_test_set(self) -> bool:
        """True when no training images are held out, so validation reads the test set."""
        return False

    def predict_name(self, index: int) -> str:
        return self.predict_names[index] if index < len(self.predict_names) else str(index)

    def use_data_dir(self, folder: Path) -> None:
        """Read the data from ``folder`` instead (``export.py --data_dir``); a subclass that reads a folder says how."""
        raise DataSettingError(
            f"--data_dir {folder}: {type(self).__name__} reads no folder that --data_dir could replace; "
            "leave --data_dir out, or override use_data_dir in the DataModule"
        )

    def held_out_images(self) -> HeldOutImages:
        """The test split, or the validation split where the data has no test split of its own; after setup()."""
        if self.test_set is None:
            raise DataError("held_out_images() needs setup() to have run")
        split = "val" if self.test_set is self.val_set and not self.validates_on_test_set else "test"
        return self._images_of(self.test_set, split)

    def validation_images(self) -> HeldOutImages:
        """The validation split (with ``folds``, the fold held out), as evaluation serves it; after setup()."""
        if self.val_set is None:
            raise DataError("validation_images() needs setup() to have run")
        return self._images_of(self.val_set, "val")

    def image_names(self, split: MemmapBatches) -> list[str]:
        """What each image of ``split`` is: its row in its file here; a subclass that reads files names them."""
        rows = split.indices if split.indices is not None else range(len(split))
        return [f"{split.paths[0].stem.removesuffix('_images')} row {row}" for row in rows]

    def _images_of(self, split_set: MemmapBatches, split: str) -> HeldOutImages:
        images, labels = split_set.view(self.image_size)  # packed with a margin: its centre, as evaluated
        names = self.image_names(split_set)
        return HeldOutImages(split, images, labels, names, self.title, str(split_set.paths[0].parent))

    def training_sample(self, count: int, seed: int = 0) -> np.ndarray:
        """``count`` training images drawn without replacement by ``seed`` (all classes, not the first rows)."""
        if self.train_set is None:
            raise DataError("training_sample() needs setup() to have run")
        count = min(count, len(self.train_set))
        positions = np.sort(np.random.default_rng(seed).choice(len(self.train_set), size=count, replace=False))
        return np.ascontiguousarray(centre_crop(self.train_set.__getitems__(positions.tolist())[0], self.image_size))

    def train_images(self, count: int) -> Tensor:
        """The first ``count`` training images (uint8, on the CPU), in their fixed order: for fitting layers to data."""
        if self.train_set is None:
            raise DataError("train_images() needs setup() to have run")
        return centre_crop(self.train_set.__getitems__(range(min(count, len(self.train_set))))[0], self.image_size)

    def _sizes(self) -> BatchSizes:
        if self.batches is None:
            raise DataError("the loaders need setup() to have run")
        return self.batches

    def loader(self, split: str, batch_size: int, train: bool) -> DataLoader:
        """The loader of ``split``; ``train``: the exact-resume training order (a subclass may serve otherwise)."""
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
            shards = {"num_replicas": world_size, "rank": rank, "seed": self.seed, "drop_last": True}
            if self.sampler == "balanced":
                weights = balanced_weights(memmapped.view()[1])
                sampler = BalancedEpochSampler(memmapped, self._current_epoch, weights, **shards)
            else:
                sampler = TrainerEpochSampler(memmapped, self._current_epoch, shuffle=True, **shards)
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
            worker_init_fn=start_worker if workers > 0 else None,
            multiprocessing_context=worker_context(workers, world_size, dataset, start_worker),
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
        return self.loader("train", self._sizes().per_device, train=True)

    @override
    def val_dataloader(self) -> DataLoader | list:
        if self.val_set is not None and len(self.val_set) == 0 and self.folds:  # data.fold null: nothing to validate
            return []  # Lightning's way of saying so: no validation loop runs
        return self.loader("val", self._sizes().eval_per_device, train=False)

    @override
    def test_dataloader(self) -> DataLoader:
        return self.loader("test", self._sizes().eval_per_device, train=False)

    @override
    def predict_dataloader(self) -> DataLoader:
        return self.loader("predict", self._sizes().eval_per_device, train=False)

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
            images, labels = self.augment.mix(images, labels)
        else:  # images packed with a margin (an evaluation crop's) are evaluated on their centre
            images = centre_crop(images, self.image_size)
        return images, labels


def load_image_folder(
    folder: Path, size: int, resize: Resize = "crop", interpolation: Interpolation = "bilinear", crop_pct: float = 1.0
) -> tuple[Tensor, list[str]]:
    """Every image under ``folder`` as uint8 (N, 3, size, size), with its path relative to ``folder``, sorted.

    For ``predict``: a file that cannot be read as an image is skipped with a one-line warning
    naming it, so one bad file never stops the others.
    """
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise DataSettingError(f"data.predict_dir={folder} is not a folder; point it at a folder of PNG/JPEG images")
    images, names = [], []
    for path in sorted(p for p in folder.rglob("*") if is_image_file(p) and p.is_file()):
        try:
            pixels = decode_image(path, size, resize, interpolation, crop_pct)
        except BadImageError as error:
            if rank_zero_only.rank == 0:
                log.warning("skipped %s: not a readable image (%s)", path, error)
            continue
        images.append(pixels.transpose(2, 0, 1))
        names.append(path.relative_to(folder).as_posix())
    if not images:
        raise DataSettingError(
            f"data.predict_dir={folder} holds no readable image ({', '.join(IMAGE_SUFFIXES)}); "
            "point it at a folder of images"
        )
    return torch.from_numpy(np.ascontiguousarray(np.stack(images))), names
