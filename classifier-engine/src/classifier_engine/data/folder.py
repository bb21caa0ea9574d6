"""Your own labelled images (class folders, split folders, a CSV list or arrays) on the same fast path as CIFAR.

With ``source`` set, the same class streams a store ``pack.py`` wrote instead (``streamed.py``): the
project's augmentation applies to streamed runs as to packed ones, and its ``split()`` decided what the
pack held out.

The first ``fit`` decodes every image once, at ``image_size`` by the ``resize`` rule, into a
packed copy under ``cache_dir`` (``packing.py``); every later command reuses it until
an image or a packing setting changes. Validation and test images are held out by a seeded
split, stratified by class, unless the source gives its own ``val``/``test`` splits. A checkpoint
records the packed copy and the rows held out, so a rebuilt DataModule (``export.py``) reads the
images the run trained on, split as the run split them, even where the image folder is gone.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path, PurePath
from typing import Any, Literal

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from ..foundation.errors import check_choice
from ..foundation.files import writable
from ..foundation.plain_values import NAME
from .datamodule import ImageDataModule
from .dataset import MemmapBatches
from .errors import DataError, DataSettingError
from .folds import group_of_key, strata
from .image_files import Interpolation, Resize
from .image_sources import LabelledImages, find_images
from .packing import (
    IMBALANCE_RATIO,
    PackedImages,
    PackSettings,
    class_table,
    imbalance,
    manifest_digest,
    open_packed,
    pack,
    packed_folder,
    packed_read_only,
)
from .preprocessing import IMAGENET_MEAN, IMAGENET_STD

BadImagePolicy = Literal["skip", "error"]
_found: dict[
    tuple[str, str, bool], LabelledImages
] = {}  # one walk of a folder per process (the CLI's fingerprint, then the module)


Task = Literal["auto", "multiclass", "multilabel"]
# ImageFolderDataModule's own settings (the rest are ImageDataModule's, passed on as they are).
FOLDER_SETTINGS = (
    "image_dir",
    "image_size",
    "resize",
    "val_fraction",
    "test_fraction",
    "split_seed",
    "cache_dir",
    "on_bad_image",
    "pack_workers",
    "class_names",
    "mean",
    "std",
    "interpolation",
    "crop_pct",
    "task",
    "allow_paths_outside",
    "source",
    "storage_options",
    "max_cache_size",
)


def labelled_images(image_dir: str | Path, task: str = "auto", allow_outside: bool = False) -> LabelledImages:
    key = (str(Path(image_dir).expanduser().resolve()), task, allow_outside)
    if key not in _found:
        _found[key] = find_images(Path(key[0]), task, allow_outside)
    return _found[key]


def stratified_split(labels: np.ndarray, fractions: tuple[float, float], seed: int) -> tuple[np.ndarray, ...]:
    """Row indices (train, val, test): each class split by ``fractions`` (val, test), seeded; one always trains.

    A class with at least two images gives at least one to each share asked for, so every class is validated.
    The test rows do not depend on the validation share (``data.folds`` sets it to 0) where a class has images
    enough for both, so a cross-validation and a single-split run of one seed are tested on the same photos.
    Multi-label rows are stratified by their rarest class (``strata``).
    """
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = [[], [], []]
    labels = strata(labels)
    for label in np.unique(labels):
        rows = rng.permutation(np.flatnonzero(labels == label))
        counts = [round(share * len(rows)) for share in fractions]
        counts = [
            max(count, 1) if share > 0 and len(rows) > sum(counts) else count
            for count, share in zip(counts, fractions, strict=True)
        ]
        while sum(counts) >= len(rows) and sum(counts) > 0:  # keep one to train on: take from test first
            last = max(index for index, count in enumerate(counts) if count > 0)
            counts[last] -= 1
        # The test rows are drawn first: the same photos whatever the validation share.
        test_end = counts[1]
        val_end = test_end + counts[0]
        parts[2].append(rows[:test_end])
        parts[1].append(rows[test_end:val_end])
        parts[0].append(rows[val_end:])
    return tuple(np.sort(np.concatenate(part)) if part else np.zeros(0, np.int64) for part in parts)


class ImageFolderDataModule(ImageDataModule):
    """Batches of your own images as uint8 (N, 3, image_size, image_size) tensors, packed once (or streamed)."""

    def __init__(
        self,
        image_dir: str = "data/images",
        image_size: int | None = 64,
        resize: Resize = "crop",
        val_fraction: float = 0.1,
        test_fraction: float = 0.0,
        split_seed: int = 0,
        pool_val: bool = False,
        cache_dir: str = "data/packed",
        on_bad_image: BadImagePolicy = "skip",
        pack_workers: int | None = None,
        class_names: list[str] | None = None,
        mean: tuple[float, float, float] | None = None,
        std: tuple[float, float, float] | None = None,
        interpolation: Interpolation | None = None,
        crop_pct: float | None = None,
        task: Task = "auto",
        allow_paths_outside: bool = False,
        source: str | None = None,
        storage_options: dict[str, Any] | None = None,
        max_cache_size: str = "50GB",
        **kwargs: Any,
    ) -> None:
        """Configure the data.

        Args:
            image_dir: Folder of class folders (<class>/*.jpg), of train/val/test split folders, of .npy arrays
                (images.npy, labels.npy), or a .csv list of path,label rows.
            image_size: Side in pixels of the square images the network sees (every image is resized once, when packed);
                null with data.source: the size the store was packed at.
            resize: How an image becomes a square: crop (shorter side to image_size, centre cut), pad (longer side
                to image_size, black borders) or stretch.
            val_fraction: Share of each class's training images held out for validation (when no val split is given).
            test_fraction: Share of each class's training images held out for testing (when no test split is
                given); with 0, test reads the validation images.
            split_seed: Seed of the fixed, stratified held-out split (independent of the run's seed).
            pool_val: With data.folds: deal a given val/ split's images into the folds too (without it, a folder
                with its own val/ split is refused, since its images would be in no fold).
            cache_dir: Folder of packed copies (one per source and packing settings; image_dir is never written).
            on_bad_image: What an unreadable, truncated or empty image does: skip (left out, listed beside the
                packed copy) or error (the first one stops packing).
            pack_workers: Processes decoding images while packing; default: one per CPU core.
            class_names: The classes, where image_dir is not at hand (predict on a folder, or export, with a
                checkpoint: they are taken from it); by default the class folders' names.
            mean: Per-channel mean the network normalizes with; null: what the network's pretrained weights
                expect (model.backbone's), else ImageNet's.
            std: Per-channel standard deviation, as mean.
            interpolation: How images are resized when packed (bilinear or bicubic); null: as the network's weights
                expect, else bilinear.
            crop_pct: With resize crop, the share of the shorter side kept (pretrained weights' evaluation crop:
                the shorter side to image_size / crop_pct, then the centre); null: as the weights expect, else 1.
            task: multiclass (one label per image), multilabel (a set of labels per image: one sigmoid per class)
                or auto (multilabel when a CSV gives several labels per image or one 0/1 column per class).
            allow_paths_outside: Let a .csv list name images outside its own folder (../, absolute paths, links);
                off, such a list is refused, since a list from elsewhere could pack any file it names.
            source: Stream a store pack.py wrote instead of packing image_dir: s3://bucket/prefix, gs://...,
                r2://..., or a folder (its split and packing settings are the pack's; this class's augmentation
                applies); null: image_dir, packed under cache_dir.
            storage_options: With source: options for the store's client beyond the AWS_* variables
                (endpoint_url, aws_access_key_id, ...), as litdata passes them.
            max_cache_size: With source: most disk the streamed training chunks take under cache_dir (e.g. 50GB).
            **kwargs: How batches are served and augmented (``ImageDataModule``).
        """
        from .streams.datamodule import StreamedImageDataModule, streaming_class

        if source is not None and not isinstance(self, StreamedImageDataModule):
            # This very class, streaming: its methods that read data are the stream's, the rest (the project's
            # augmentation) its own. Set before anything is built, so the object is only ever the one kind.
            settings = {name: value for name, value in locals().items() if name in FOLDER_SETTINGS}
            self.__class__ = streaming_class(type(self))
            self.__init__(**settings, **kwargs)
            return
        super().__init__(**kwargs)
        if image_size is None:
            raise ValueError("data.image_size: null is the packed size of a store (data.source); give image_dir's size")
        check_choice("data.resize", resize, Resize)
        check_choice("data.on_bad_image", on_bad_image, BadImagePolicy)
        check_choice("data.task", task, Task)
        if interpolation is not None:
            check_choice("data.interpolation", interpolation, Interpolation)
        if crop_pct is not None and not 0.5 <= crop_pct <= 1:
            raise ValueError(f"data.crop_pct must be a share between 0.5 and 1, got {crop_pct}")
        if not 8 <= image_size <= 1024:
            raise ValueError(f"data.image_size must be between 8 and 1024 pixels, got {image_size}")
        if not (0 <= val_fraction < 1 and 0 <= test_fraction < 1 and val_fraction + test_fraction < 1):
            raise ValueError(
                f"data.val_fraction and data.test_fraction must be shares in [0, 1) that leave images to train on, "
                f"got {val_fraction} and {test_fraction}"
            )
        self.image_dir = Path(image_dir).expanduser()
        self.image_size = image_size
        self.resize = resize
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.split_seed = split_seed
        self.cache_dir = Path(cache_dir).expanduser()
        self.on_bad_image = on_bad_image
        self.pack_workers = pack_workers
        self.mean = tuple(mean) if mean is not None else IMAGENET_MEAN
        self.std = tuple(std) if std is not None else IMAGENET_STD
        self.interpolation: Interpolation = interpolation or "bilinear"
        self.crop_pct = crop_pct or 1.0
        self.title = f"images of {self.image_dir}"
        self.packed: PackedImages | None = None
        self.tests_on_validation_set = False
        self.held_out_rows: dict[str, np.ndarray] = {}  # rows of the packed training images held out (val, test)
        self.rows_of: str | None = None  # the packed copy (its folder name: the manifest's digest) the rows index
        self.recorded_copy: Path | None = None  # the packed copy a checkpoint names (or export.py --data_dir)
        self.found: LabelledImages | None = None
        self.task = "multiclass" if task == "auto" else task
        if class_names and not self.image_dir.exists():
            # A trained model's data without its image folder (predict a new folder, export from the packed
            # copy the checkpoint names): the classes (and the task, from the checkpoint) are all it needs.
            self.class_names = list(class_names)
            return
        self.found = labelled_images(self.image_dir, task, allow_paths_outside)
        self.task = self.found.task
        self.class_names = list(self.found.class_names)
        if class_names and list(class_names) != self.class_names:
            raise DataSettingError(
                f"data.image_dir={self.image_dir} has the classes {self.class_names[:5]}..., the model was trained "
                f"on {list(class_names)[:5]}...; point data.image_dir at the images the model was trained on"
            )
        if pool_val:
            self.found = self.found.pooled()
        if self.folds and "val" in self.found.splits:
            raise DataSettingError(
                f"data.image_dir={self.image_dir} has its own val split, which the folds would leave out (they deal "
                "the training images); set data.pool_val true to deal its images into the folds too"
            )
        self.class_counts = self.found.class_counts("train")
        self.images_counted = len(self.found.splits["train"])
        if self.folds > max(self.class_counts, default=0):
            raise DataSettingError(
                f"data.folds={self.folds} is more folds than the largest class has images ({max(self.class_counts)}"
                f" in {self.image_dir}): a fold would hold none; lower data.folds to at most {max(self.class_counts)}"
            )
        if val_fraction == 0 and "val" not in self.found.splits and not self.folds:
            raise ValueError(
                f"data.val_fraction is 0 and {self.image_dir} has no val split, so nothing would be validated; "
                "set data.val_fraction (e.g. 0.1)"
            )

    @property
    def image_root(self) -> Path:
        """The folder the images' names are relative to: image_dir, or a CSV list's folder."""
        return self.image_dir.parent if self.image_dir.suffix.lower() == ".csv" else self.image_dir

    @property
    def settings(self) -> PackSettings:
        return PackSettings(self.image_size, self.resize, self.interpolation, self.crop_pct)

    @classmethod
    def data_fingerprint(cls, settings: Mapping[str, Any], stage: str) -> str:
        """The manifest's digest (every image's path, size and time, and the packing settings): what is trained on."""
        if settings.get("source"):
            from .streams.datamodule import StreamedImageDataModule

            return StreamedImageDataModule.data_fingerprint(settings, stage)
        if stage == "predict" and settings.get("predict_dir"):
            return f"images:{settings['predict_dir']}"
        found = labelled_images(
            settings.get("image_dir", "data/images"),
            settings.get("task") or "auto",
            bool(settings.get("allow_paths_outside")),
        )
        pack_settings = PackSettings(
            int(settings.get("image_size", 64)),
            settings.get("resize", "crop"),
            settings.get("interpolation") or "bilinear",
            settings.get("crop_pct") or 1.0,
        )
        if settings.get("pool_val"):
            found = found.pooled()
        cache_dir = Path(settings.get("cache_dir", "data/packed")).expanduser()
        if not writable(cache_dir):  # refused before anything is built, unless a whole copy is there to read
            packed_read_only(cache_dir, found, pack_settings)
        groups = ""  # a CSV list's groups decide the folds: a run on other groups is another run
        if found.groups and settings.get("folds"):
            groups = ":groups:" + hashlib.sha256(json.dumps(found.groups, sort_keys=True).encode()).hexdigest()[:16]
        return f"images:{manifest_digest(found, pack_settings)}{groups}"

    @override
    def use_data_dir(self, folder: Path) -> None:
        """Read the packed copy in ``folder`` (a folder under ``cache_dir``) instead of the one the run recorded."""
        folder = Path(folder).expanduser()
        if open_packed(folder) is None:
            raise DataError(
                f"{folder} holds no whole packed copy of images; pass a folder under data.cache_dir that fit packed"
            )
        self.recorded_copy = folder

    def _recorded_packed(self) -> PackedImages | None:
        """The packed copy the checkpoint (or ``use_data_dir``) names, if it is whole."""
        return open_packed(self.recorded_copy) if self.recorded_copy is not None else None

    @override
    def prepare_data(self) -> None:
        if self.predicting_own_images() or self._recorded_packed() is not None:
            return
        if self.found is None:
            where = (
                f"the packed copy {self.recorded_copy} is not whole either" if self.recorded_copy else "no packed copy"
            )
            raise DataError(
                f"data.image_dir {self.image_dir} does not exist and {where}; point data.image_dir at the images, "
                "or pass the packed copy (a folder under data.cache_dir)"
            )
        packed = pack(
            self.found, self.settings, self.cache_dir, workers=self.pack_workers, on_bad_image=self.on_bad_image
        )
        rank_zero_info(f"Data: images per class and split\n{class_table(packed)}")
        train_counts = packed.meta["class_counts"]["train"]
        ratio = imbalance(train_counts)
        if ratio >= IMBALANCE_RATIO:
            rank_zero_info(
                f"Warning: the classes are strongly imbalanced ({max(train_counts)} training images in the largest, "
                f"{min(train_counts)} in the smallest); model.class_weights: balanced weighs each class equally, "
                "data.sampler: balanced draws each class equally often"
            )

    @override
    def setup(self, stage: str) -> None:
        if stage == "predict" and self.predict_dir is not None:
            self.setup_own_predictions()
            return
        packed = self._recorded_packed()
        if packed is None and self.found is not None:
            packed = open_packed(packed_folder(self.cache_dir, self.found, self.settings))
        if packed is None:
            raise DataError(f"no packed copy of {self.image_dir} in {self.cache_dir}; prepare_data() must run first")
        if packed.class_names != self.class_names:
            raise DataSettingError(
                f"the packed copy {packed.root} has other classes than data.class_names ({packed.class_names[:3]}... "
                f"vs {self.class_names[:3]}...); pass the packed copy of the images the model was trained on"
            )
        self.packed = packed
        train_split = packed.split("train")
        labels = np.load(train_split.labels)
        given_val, given_test = "val" in packed.splits, "test" in packed.splits
        train_rows, val_rows, test_rows = self._split_rows(packed, labels, given_val, given_test)
        self.held_out_rows = {"val": val_rows, "test": test_rows}
        train = MemmapBatches(train_split.images, train_split.labels, train_rows, with_ids=True)
        val = (
            self._split(packed, "val") if given_val else MemmapBatches(train_split.images, train_split.labels, val_rows)
        )
        if given_test:
            test = self._split(packed, "test")
        elif len(test_rows):
            test = MemmapBatches(train_split.images, train_split.labels, test_rows)
        else:
            test = val
        self.tests_on_validation_set = test is val
        if len(val) == 0 and not self.folds:  # with folds, the fold held out is validated
            raise DataSettingError(
                f"{self.image_dir}: no image is left for validation; add images or raise data.val_fraction"
            )
        if self.task == "multilabel" and stage == "fit" and not self.folds:
            self._check_validation_positives(val)
        self.serve(stage, train, val, test)
        self.predict_names = self.image_names(test)
        if stage in ("test", "predict") and self.tests_on_validation_set and len(val):
            rank_zero_info("Data: no test split (data.test_fraction is 0): test and predict read the validation images")

    def _check_validation_positives(self, val: MemmapBatches) -> None:
        """Each class's threshold is chosen on the validation images: refuse a class none of them shows."""
        _, labels = val.view()
        missing = [name for name, count in zip(self.class_names, labels.sum(axis=0), strict=True) if count == 0]
        if missing:
            which = (
                f"label {missing[0]}, so its threshold"
                if len(missing) == 1
                else (f"labels {', '.join(missing[:5])}, so their thresholds")
            )
            raise DataSettingError(
                f"{self.image_dir}: no validation image has the {which} cannot be chosen; add images with it "
                "(at least two) or raise data.val_fraction"
            )

    def _split_rows(
        self, packed: PackedImages, labels: np.ndarray, given_val: bool, given_test: bool
    ) -> tuple[np.ndarray, ...]:
        """Rows of the packed training images to train on, validate on and test on.

        As the checkpoint recorded them for this copy of the images (the split is never derived again
        for a trained run), else by the seeded, stratified split.
        """
        if self.held_out_rows and self.rows_of == packed.root.name:
            val_rows, test_rows = self.held_out_rows["val"], self.held_out_rows["test"]
            held_out = np.concatenate([val_rows, test_rows])
            if len(held_out) and (
                held_out.min() < 0 or held_out.max() >= len(labels) or len(np.unique(held_out)) < len(held_out)
            ):
                raise DataSettingError(
                    f"the checkpoint's held-out rows do not index the {len(labels)} training images of {packed.root} "
                    "once each; pass the packed copy the run trained on"
                )
            train_rows = np.setdiff1d(np.arange(len(labels)), np.concatenate([val_rows, test_rows]))
            return train_rows, val_rows, test_rows
        # With data.folds, the fold held out is the validation split: no share of the images is set aside for it.
        val_share = 0.0 if given_val or self.folds else self.val_fraction
        fractions = (val_share, 0.0 if given_test else self.test_fraction)
        return self.split(labels, fractions)

    def split(self, labels: np.ndarray, fractions: tuple[float, float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows (train, val, test) of a new run's packed training images, ``fractions`` being (val, test) shares.

        Seeded by ``split_seed`` and stratified by class; a subclass may split otherwise (by photographer, by
        date, ...). A trained run never splits again: its checkpoint records the rows it held out.
        """
        return stratified_split(labels, fractions, self.split_seed)

    @override
    def fold_groups(self, split: MemmapBatches) -> np.ndarray | None:
        """Each image's group (``folds.py``): a CSV list's ``group`` column, else the first folder below its class
        folder (``<class>/<group>/*.jpg``); an image without one is a group of its own."""
        if self.found is None:
            return None
        names = self.image_names(split)
        if self.found.groups:
            return np.array([self.found.groups.get(name, name) for name in names])
        depth = {"class folders": 1, "split folders": 2}.get(self.found.layout)
        return None if depth is None else np.array([group_of_key(name, depth) for name in names])

    @override
    def image_names(self, split: MemmapBatches) -> list[str]:
        """Each image's file, relative to ``image_dir`` (its key in the packed copy)."""
        if self.packed is None:
            return super().image_names(split)
        keys = self.packed.keys(split.paths[0].name.removesuffix("_images.npy"))
        return [keys[row] for row in (split.indices if split.indices is not None else range(len(split)))]

    @staticmethod
    def _split(packed: PackedImages, name: str) -> MemmapBatches:
        split = packed.split(name)
        return MemmapBatches(split.images, split.labels)

    @override
    def state_dict(self) -> dict[str, Any]:
        """Which packed copy the run read, which split tests, and the rows held out of the training images."""
        if self.packed is None:
            return {}
        test_split = "val" if self.tests_on_validation_set else "test"
        rows = {name: torch.from_numpy(np.asarray(value, dtype=np.int64)) for name, value in self.held_out_rows.items()}
        return {"packed_copy": str(self.packed.root.resolve()), "test_split": test_split, "held_out_rows": rows}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The recorded packed copy and split, read by a DataModule rebuilt for a checkpoint before its setup.

        A checkpoint is data: of the packed copy it records only the folder's name is taken (a name, never a
        path), looked up under this DataModule's own ``cache_dir``; the rows it held out are checked against
        that copy in ``_split_rows``. A resumed fit restores the state after its setup, from the same images
        split the same way (the run's identity holds the manifest and the split settings), so nothing
        changes there.
        """
        recorded = state_dict.get("packed_copy")
        if not isinstance(recorded, str):
            return
        name = PurePath(recorded.replace("\\", "/")).name
        if not NAME.fullmatch(name) or name in (".", ".."):
            raise DataSettingError(f"the checkpoint's packed copy {name!r} is not the name of a packed copy")
        if self.recorded_copy is None:
            self.recorded_copy = self.cache_dir / name
        rows = state_dict.get("held_out_rows")
        if isinstance(rows, dict) and set(rows) == {"val", "test"}:  # earlier releases recorded no rows
            if not all(
                torch.is_tensor(value) and value.ndim == 1 and value.dtype == torch.int64 for value in rows.values()
            ):
                raise DataSettingError("the checkpoint's held-out rows are not lists of image rows")
            self.held_out_rows = {name: value.numpy() for name, value in rows.items()}
            self.rows_of = name
