"""Your own images streamed to every rank from object storage (or a folder), as ``pack.py`` packed them with litdata.

A project's folder DataModule streams with ``data.source`` set: ``ImageFolderDataModule`` then becomes
``streaming_class(cls)``, its own class with this module's loaders in front, so the project's
augmentation (``sized_augmentation``) trains the streamed run as it trains a packed one.

Training streams: each rank reads its share of litdata's chunks through a local cache of bounded
size, in litdata's seeded order of epoch e, a few images per item (``pack.py``). The held-out
splits are small and read whole: once per machine, into the cache (``prepare_data``), then served
from a memory map like a local copy, so validation, the test report and ``export.py`` see each
image exactly once under any number of ranks. The run's identity is the dataset's digest (what was
packed), not its URL: a copy moved to another bucket is the same data.

A resumed epoch restarts litdata's loader at the batch after the last one trained, from the trainer's
own progress (``stream_loader.py``, as ``loader.py`` does for the memory map): the order, the
augmentation and the weights equal an uninterrupted run's for the same ranks, workers and batch size.
On other ranks or workers, the rest of the epoch is restriped over them, none lost or repeated
(``stream_position.py``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch.utils.data import DataLoader
from typing_extensions import override

from ...foundation.files import NoSpaceError, Partial, free_bytes, megabytes
from ...foundation.process_lifetime import worker_context
from ..batches import BatchSizes
from ..datamodule import ImageDataModule
from ..dataset import MemmapBatches
from ..errors import DataError, DataSettingError
from ..image_files import Interpolation, centre_crop
from ..preprocessing import IMAGENET_MEAN, IMAGENET_STD
from . import position as stream_position
from .format import DATASET_FILE, STREAM_FORMAT_VERSION, read_record
from .loader import concatenated, loader_class, stream_worker_init
from .object_store import check_location, configure_store_client, is_remote, join, random_state_kept, store_error
from .position import Topology

HELD_OUT = ("val", "test")
_records: dict[tuple[str, str], dict[str, Any]] = {}  # one read of a dataset's record per process


def dataset_record(source: str, storage_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``dataset.json`` of the packed dataset at ``source``, or a one-line refusal of a store that has none."""
    source = check_location(source, "data.source")
    key = (source, json.dumps(dict(storage_options or {}), sort_keys=True))
    if key not in _records:
        try:
            import litdata  # noqa: F401  (the optional extra)
        except ImportError:
            raise DataSettingError('streaming needs litdata; pip install -e ".[streaming]"') from None
        configure_store_client()
        record = read_record(source, dict(storage_options or {}))
        if record is None:
            raise DataSettingError(
                f"data.source {source} holds no packed dataset ({DATASET_FILE} is missing); pack one there with "
                f"python pack.py --data.image_dir <images> --output {source}, or check the URL"
            )
        if record.get("format_version") != STREAM_FORMAT_VERSION:
            raise DataSettingError(f"{source} was packed by another release of pack.py; pack it again")
        _records[key] = record
    return _records[key]


class StreamedImageDataModule(ImageDataModule):
    """Batches of your own images (uint8 (N, 3, S, S)) streamed from a dataset ``pack.py`` wrote."""

    def __init__(
        self,
        source: str = "data/streamed",
        storage_options: dict[str, Any] | None = None,
        cache_dir: str = "data/stream_cache",
        max_cache_size: str = "50GB",
        image_size: int | None = None,
        class_names: list[str] | None = None,
        mean: tuple[float, float, float] | None = None,
        std: tuple[float, float, float] | None = None,
        interpolation: Interpolation | None = None,
        crop_pct: float | None = None,
        **kwargs: Any,
    ) -> None:
        """Configure the stream.

        Args:
            source: Where pack.py put the dataset: s3://bucket/prefix, gs://..., r2://..., or a folder.
            storage_options: Options for the store's client beyond the AWS_* variables (endpoint_url,
                aws_access_key_id, ...), as litdata passes them.
            cache_dir: Local folder for the streamed chunks (bounded by max_cache_size) and the held-out images.
            max_cache_size: Most disk the training chunks take in cache_dir (e.g. 50GB); older chunks are evicted.
            image_size: Side in pixels the network sees; null: the packed size (pack.py --data.image_size).
            class_names: The classes; null: the packed dataset's (a checkpoint's are checked against them).
            mean: Per-channel mean the network normalizes with; null: the network's pretrained weights', else
                ImageNet's.
            std: Per-channel standard deviation, as mean.
            interpolation: How the images were resized; null: as packed (a value that differs is refused:
                pack again with it).
            crop_pct: The evaluation crop's share the images were packed with; null: as packed (as interpolation).
            **kwargs: How batches are served and augmented (``ImageDataModule``).
        """
        # Not super(): in a folder DataModule's streaming class (``streaming_class``) the next class is the folder
        # DataModule, whose image folder a stream does not read.
        ImageDataModule.__init__(self, **kwargs)
        if self.sampler != "shuffle":
            raise ValueError(
                "data.sampler: balanced draws from memory-mapped images; a streamed store is read in its shuffled "
                "order (use model.class_weights: balanced for imbalanced classes)"
            )
        self.source = check_location(source, "data.source")
        self.storage_options = dict(storage_options or {})
        self.cache_dir = Path(cache_dir).expanduser()
        self.max_cache_size = max_cache_size
        record = dataset_record(self.source, self.storage_options)
        self.record = record
        for key, value in (("image_size", image_size), ("interpolation", interpolation), ("crop_pct", crop_pct)):
            if value is not None and value != record[key]:
                raise ValueError(
                    f"data.{key} is {value}, but {self.source} was packed with {key} {record[key]}; leave "
                    f"data.{key} out (null) to use it, or pack again with pack.py --data.{key} {value}"
                )
        if class_names and list(class_names) != record["class_names"]:
            raise ValueError(
                f"{self.source} holds the classes {record['class_names'][:5]}..., the model was trained on "
                f"{list(class_names)[:5]}...; point data.source at the images the model was trained on"
            )
        if self.folds:
            raise ValueError("data.folds: cross-validation reads a local copy; run check_labels.py on the folder")
        per_item = int(record["images_per_item"])
        # (null, the batch from the number of images, is 16, 32 or 64: a multiple of any power of two to 8)
        if self.global_batch_size is None and self.batch_size is not None and self.batch_size % per_item:
            suggestion = max(per_item, self.batch_size // per_item * per_item)
            raise ValueError(
                f"{self.source} stores {per_item} images per item, and data.batch_size {self.batch_size} is not a "
                f"multiple of it; set data.batch_size to one (e.g. {suggestion})"
            )
        self.class_names = list(record["class_names"])
        self.image_size = int(record["image_size"])
        self.resize = record["resize"]
        self.interpolation = record["interpolation"]
        self.crop_pct = float(record["crop_pct"])
        self.side = int(record["side"])
        # The checkpoint and HPARAMS record what was used (the model's copies must agree), not the nulls.
        resolved = {"image_size": self.image_size, "interpolation": self.interpolation, "crop_pct": self.crop_pct}
        self.save_hyperparameters({**self.hparams, **resolved})
        self.per_item = int(record["images_per_item"])
        self.class_counts = list(record["class_counts"]["train"])
        self.mean = tuple(mean) if mean is not None else IMAGENET_MEAN
        self.std = tuple(std) if std is not None else IMAGENET_STD
        self.title = f"streamed from {self.source}"
        self.storage = "memmap"  # streamed chunks are read by the loader's workers
        self.streamed_train: Any = None  # litdata's dataset of the training split, made in setup()
        self.segment: stream_position.Segment | None = None  # the stretch of the epoch this process streams
        self.restored_segment: stream_position.Segment | None = None  # the checkpoint's, until the epoch starts

    @classmethod
    def data_fingerprint(cls, settings: Mapping[str, Any], stage: str) -> str:
        """The packed dataset's digest (every image's path, size and time, and the packing settings)."""
        if stage == "predict" and settings.get("predict_dir"):
            return f"images:{settings['predict_dir']}"
        record = dataset_record(settings.get("source", "data/streamed"), settings.get("storage_options"))
        return f"images:{record['digest']}"

    @property
    def cache_root(self) -> Path:
        """This dataset's place in the cache: a fixed function of the dataset (litdata's resume state records it)."""
        return self.cache_dir / self.record["digest"][:16]

    @override
    def use_data_dir(self, folder: Path) -> None:
        """Stream from ``folder`` (a copy of the packed dataset) instead (``export.py --data_dir``)."""
        record = dataset_record(str(folder), self.storage_options)
        if record["digest"] != self.record["digest"]:
            raise DataSettingError(f"{folder} holds another packed dataset than {self.source}; pass a copy of it")
        self.source, self.record = check_location(str(folder), "--data_dir"), record

    @override
    def prepare_data(self) -> None:
        """Read the held-out splits once per machine into the cache (whole, or not at all)."""
        if self.predicting_own_images():
            return
        for split in HELD_OUT:
            if split in self.record["counts"] and not self._held_out_path(split).is_dir():
                self._read_held_out(split)

    def _input_dir(self, split: str, cache: str) -> Any:
        """litdata's input of ``split``: in object storage, through the cache folder ``cache`` of this dataset."""
        from litdata.streaming.resolver import Dir

        if not is_remote(self.source):
            return join(self.source, split)
        return Dir(path=str(self.cache_root / cache), url=join(self.source, split))

    @random_state_kept
    def _stream(self, split: str) -> Any:
        """litdata's shuffled dataset of ``split``, made after the process group exists (litdata reads the world
        size once, when it is made)."""
        from litdata import StreamingDataset

        try:
            return StreamingDataset(
                input_dir=self._input_dir(split, split),
                shuffle=True,
                drop_last=True,  # every rank gets as many batches (ranks otherwise wait at epoch end)
                seed=int(torch.initial_seed()) % 2**32,  # the run's seed; a 64-bit one when nothing set it
                storage_options=self.storage_options,
                max_cache_size=self.max_cache_size,
            )
        except Exception as error:
            raise store_error(error, self.source) from error

    def _held_out_path(self, split: str) -> Path:
        return self.cache_root / split

    @random_state_kept
    def _read_held_out(self, split: str) -> None:
        from litdata import StreamingDataset

        configure_store_client()
        count = self.record["counts"][split]
        needed = count * 3 * self.side * self.side
        target = self._held_out_path(split)
        target.parent.mkdir(parents=True, exist_ok=True)
        if free_bytes(target.parent) < needed * 1.05 + 2**20:
            raise NoSpaceError(
                target, needed, free_bytes(target.parent), remedy="point data.cache_dir at a disk with room"
            )
        partial = Partial(target, needed)
        try:
            partial.path.mkdir()
            dataset = StreamingDataset(
                input_dir=self._input_dir(split, f"{split}-chunks"),
                storage_options=self.storage_options,
            )
            images = np.lib.format.open_memmap(
                partial.path / f"{split}_images.npy", mode="w+", dtype=np.uint8, shape=(count, 3, self.side, self.side)
            )
            labels, ids, names, filled = [], [], [], 0
            # Every item, whatever this process's rank: len(dataset) would be this rank's share under DDP.
            for index in range(-(-count // self.per_item)):
                item = dataset[index]
                images[filled : filled + len(item["ids"])] = item["images"]
                filled += len(item["ids"])
                labels.append(item["labels"])
                ids.append(item["ids"])
                names += item["names"].split("\n") if item["names"] else []
            order = np.argsort(np.concatenate(ids), kind="stable")  # back in the split's order
            kept = np.lib.format.open_memmap(
                partial.path / f"{split}.npy", mode="w+", dtype=np.uint8, shape=(filled, 3, self.side, self.side)
            )
            kept[:] = images[:filled][order]
            kept.flush()
            del images, kept
            (partial.path / f"{split}.npy").replace(partial.path / f"{split}_images.npy")
            np.save(partial.path / f"{split}_labels.npy", np.concatenate(labels)[order])
            (partial.path / f"{split}_files.txt").write_text("".join(f"{names[i]}\n" for i in order), encoding="utf-8")
            partial.commit()
        except BaseException as error:
            partial.discard_after(error)
            if isinstance(error, (DataError, NoSpaceError, KeyboardInterrupt, SystemExit)):
                raise
            raise store_error(error, self.source) from error
        finally:
            import shutil

            shutil.rmtree(self.cache_root / f"{split}-chunks", ignore_errors=True)
        rank_zero_info(f"Data: {split} split of {self.source} read into {target} ({megabytes(needed)})")

    def _held_out(self, split: str) -> MemmapBatches:
        folder = self._held_out_path(split)
        return MemmapBatches(folder / f"{split}_images.npy", folder / f"{split}_labels.npy")

    @override
    def setup(self, stage: str) -> None:
        if stage == "predict" and self.predict_dir is not None:
            self.setup_own_predictions()
            return
        configure_store_client()
        for split in HELD_OUT:  # another machine's prepare_data may not have been this one's
            if split in self.record["counts"] and not self._held_out_path(split).is_dir():
                self._read_held_out(split)
        val = self._held_out("val")
        test = self._held_out("test") if "test" in self.record["counts"] else val
        self.tests_on_validation_set = test is val
        self.streamed_train = self._stream("train")
        train = _StreamedSplit(self.record["counts"]["train"])
        self.serve(stage, train, val, test)  # type: ignore[arg-type]
        batches = self._sizes()
        if batches.per_device % self.per_item:
            knob = "data.global_batch_size" if self.global_batch_size is not None else "data.batch_size"
            raise DataSettingError(
                f"{self.source} stores {self.per_item} images per item, and a batch of {batches.per_device} per device "
                f"is not a multiple of it; set {knob} to make it one"
            )
        self.predict_names = self.image_names(test)

    @property
    @override
    def batch_multiple(self) -> int:
        return self.per_item

    @override
    def _fit_batch_to(self, images: int, batches: BatchSizes) -> None:
        per_device = images // batches.devices
        if per_device < self.per_item:  # no batch of this split can be made of whole items, whatever data.batch_size
            fewer = 1 << max(0, (per_device // 2).bit_length() - 1)
            raise DataSettingError(
                f"{self.source} holds {per_device} training images per device, fewer than one item of "
                f"{self.per_item}, so no batch is made of whole items; pack it again with pack.py "
                f"--images_per_item {fewer} (or fewer) into another --output"
            )
        super()._fit_batch_to(images, batches)

    @override
    def keeps_on(self, device: torch.device) -> bool:
        return False

    @override
    def image_names(self, split: MemmapBatches) -> list[str]:
        names_file = split.paths[0].with_name(split.paths[0].name.replace("_images.npy", "_files.txt"))
        names = names_file.read_text(encoding="utf-8").splitlines()
        return [names[row] for row in (split.indices if split.indices is not None else range(len(split)))]

    @override
    def data_summary(self) -> str | None:
        if self.val_set is None:
            return None
        return (
            f"{self.record['counts']['train']:,} training images (streamed, {self.per_item} per item) and "
            f"{len(self.val_set):,} validation images of {self.num_classes} classes at {self.image_size} px "
            f"(from {self.source})"
        )

    @random_state_kept
    def _streamed_images(self, positions: Sequence[int]) -> np.ndarray:
        """Training images at ``positions`` of the stream's fixed (unshuffled) item order, centre as evaluated."""
        from litdata import StreamingDataset

        dataset = StreamingDataset(
            input_dir=self._input_dir("train", "train-sample"),
            storage_options=self.storage_options,
        )
        wanted = sorted(set(positions))
        items: dict[int, np.ndarray] = {}
        for item_index in sorted({position // self.per_item for position in wanted}):
            if item_index < len(dataset):
                items[item_index] = dataset[item_index]["images"]
        found = [
            items[p // self.per_item][p % self.per_item]
            for p in wanted
            if p // self.per_item in items and p % self.per_item < len(items[p // self.per_item])
        ]
        stacked = np.stack(found) if found else np.zeros((0, 3, self.side, self.side), np.uint8)
        return np.ascontiguousarray(centre_crop(stacked, self.image_size))

    @override
    def training_sample(self, count: int, seed: int = 0) -> np.ndarray:
        """``count`` training images drawn by ``seed`` from the stream (int8 calibration)."""
        total = self.record["counts"]["train"]
        count = min(count, total)
        positions = np.sort(np.random.default_rng(seed).choice(total, size=count, replace=False))
        return self._streamed_images(positions.tolist())

    @override
    def train_images(self, count: int) -> Tensor:
        return torch.from_numpy(self._streamed_images(range(min(count, self.record["counts"]["train"]))))

    @override
    def loader(self, split: str, batch_size: int, train: bool) -> DataLoader:
        if not train:
            return super().loader(split, batch_size, train)
        workers = self.num_workers
        world_size = self.trainer.world_size if self.trainer is not None else 1
        return loader_class()(
            self.streamed_train,
            batch_size=batch_size // self.per_item,
            num_workers=workers,
            collate_fn=concatenated,
            # The workers' base seed from the loader's own generator: the global random stream stays the run's.
            generator=torch.Generator().manual_seed(self.seed),
            pin_memory=self.pin_memory and torch.cuda.is_available(),
            worker_init_fn=stream_worker_init if workers > 0 else None,
            multiprocessing_context=worker_context(workers, world_size, self.streamed_train, stream_worker_init),
            current_epoch=self._current_epoch,
            batches_done=self._batches_done,
            start_segment=self._start_segment,
            restored_steps=self._restored_steps,
        )

    def _topology(self) -> Topology:
        trainer = self.trainer
        return Topology(
            world_size=trainer.world_size if trainer is not None else 1,
            num_nodes=trainer.num_nodes if trainer is not None else 1,
            num_workers=max(1, self.num_workers),
            items_per_batch=self._sizes().per_device // self.per_item,
        )

    def _restored_steps(self) -> int:
        """The steps of the checkpoint's epoch when it resumes on another topology (else 0)."""
        saved = self.restored_segment
        return saved.steps if saved is not None and saved.topology != self._topology() else 0

    def _start_segment(
        self, epoch: int, done: int, steps: int
    ) -> tuple[stream_position.Segment, dict[str, Any] | None]:
        """Note where this process's stretch of the epoch starts; litdata's state to restripe from there, if needed."""
        saved, self.restored_segment = self.restored_segment, None
        self.segment, elastic = stream_position.resume(saved, epoch, done, self._topology(), steps, self.per_item)
        if elastic:
            rank_zero_info(
                f"Data: epoch {epoch} resumes on {self.segment.topology.world_size} ranks x "
                f"{self.segment.topology.num_workers} workers after {elastic['sample_in_epoch'] * self.per_item} "
                "images; the rest is restriped, none repeated"
            )
        return self.segment, elastic

    @override
    def state_dict(self) -> dict[str, Any]:
        """Which dataset the run streamed (its digest), from where, and the epoch's layout (for an elastic resume)."""
        segment = self.segment.to_dict() if self.segment is not None else None
        return {"source": self.source, "digest": self.record["digest"], "segment": segment}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        digest = state_dict.get("digest")
        if digest is not None and digest != self.record["digest"]:
            raise DataSettingError(
                f"data.source {self.source} holds another dataset than the run streamed ({state_dict.get('source')}); "
                "point data.source at that one"
            )
        segment = state_dict.get("segment")
        try:
            self.restored_segment = stream_position.Segment.from_dict(segment) if segment else None
        except (TypeError, KeyError, ValueError, AttributeError) as error:
            raise DataSettingError(
                f"the checkpoint's stream position is not one this project writes ({error})"
            ) from error


# The folder DataModule's settings a store fixed when pack.py packed it (its split, the packing), or that name the
# folder it packed: a streaming run reads them from the store's record instead.
PACKED_SETTINGS = (
    "image_dir",
    "resize",
    "val_fraction",
    "test_fraction",
    "split_seed",
    "on_bad_image",
    "pack_workers",
    "task",
    "allow_paths_outside",
)


class FolderStream(StreamedImageDataModule):
    """The front of ``streaming_class``: a folder DataModule's settings in, this module's stream out."""

    image_root = None  # names in a store are relative to the folder pack.py read, which need not be here

    def __init__(
        self, source: str, cache_dir: str = "data/packed", image_size: int | None = None, **settings: Any
    ) -> None:
        for name in PACKED_SETTINGS:
            settings.pop(name, None)
        super().__init__(source=source, cache_dir=cache_dir, image_size=image_size, **settings)


_streaming_classes: dict[type, type] = {}


def streaming_class(folder_class: type) -> type:
    """``folder_class`` (``ImageFolderDataModule`` or a project's subclass) reading a store rather than a folder.

    Its methods that read data are this module's; the rest (``sized_augmentation``, the batch and
    augmentation settings) are ``folder_class``'s. It keeps the name of ``folder_class``, which configs and
    checkpoints name: built with ``data.source`` set, an instance of ``folder_class`` becomes one of this class.
    """
    if folder_class not in _streaming_classes:
        namespace = {
            "__module__": folder_class.__module__,
            "__qualname__": folder_class.__qualname__,
            "__doc__": folder_class.__doc__,
        }
        _streaming_classes[folder_class] = type(folder_class.__name__, (FolderStream, folder_class), namespace)
    return _streaming_classes[folder_class]


class _StreamedSplit:
    """The training split's length, for what the DataModule derives from it (batch sizes, the summary)."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length
