"""The run's own dataset, found from its checkpoint: training images to calibrate int8, the test split to judge.

An exported model is judged on the images it was trained for, not on noise. For CIFAR, the
dataset and its checksum setting come from the data settings the checkpoint records, the folder
from ``--data_dir`` (by default the folder the run trained from). For your own images, the
packed copy the run trained from (the checkpoint records it; ``--data_dir`` may name another copy)
and the run's held-out split: the test split, or the validation split where the data has no test
split (the card says which). Nothing is downloaded or packed: an export runs where the data
already is, and says so in one line when it is not.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...data.archive import archive_path, load_cache, prepare
from ...data.cifar_format import FORMATS, CifarFormat
from ...data.errors import DataError
from ...data.folder import ImageFolderDataModule, stratified_split
from ..errors import UsageError
from ..packing import PackedImages, open_packed


class MissingDataError(UsageError):
    """The images an export step needs are not where it looked; the message names the folder to pass."""


class Rows:
    """Some rows of a memory-mapped array, read only when indexed (a held-out split of the packed training images)."""

    def __init__(self, array: np.ndarray, rows: np.ndarray) -> None:
        self.array, self.rows = array, rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, key: slice | np.ndarray) -> np.ndarray:
        return self.array[self.rows[key]]


@dataclass(frozen=True)
class RunData:
    """Memory-mapped uint8 (N, 3, S, S) images and int64 labels of the run's dataset."""

    name: str
    data_dir: Path
    train_images: np.ndarray | Rows
    test_images: np.ndarray | Rows
    test_labels: np.ndarray
    split: str = "test"  # the split judged on: test, or val where the data has none


def data_settings(checkpoint: dict) -> dict:
    """The DataModule's settings as the checkpoint records them."""
    return checkpoint.get("datamodule_hyper_parameters", {})


def recorded_format(checkpoint: dict) -> CifarFormat:
    """The dataset the run trained on."""
    dataset = data_settings(checkpoint).get("dataset")
    if dataset not in FORMATS:
        raise MissingDataError(
            f"the checkpoint does not record which dataset it was trained on (data.dataset is {dataset!r}); "
            "export it with --formats onnx,pt2, which needs no data"
        )
    return FORMATS[dataset]


def recorded_data_dir(checkpoint: dict) -> Path | None:
    data_dir = data_settings(checkpoint).get("data_dir")
    return Path(data_dir) if data_dir else None


def data_present(data_dir: Path, fmt: CifarFormat) -> bool:
    """The archive or its complete converted cache is in ``data_dir`` (checked without writing there)."""
    return archive_path(data_dir, fmt).is_file() or load_cache(data_dir, fmt) is not None


def load_run_data(checkpoint: dict, class_names: list[str], data_dir: Path | None, purpose: str) -> RunData:
    """The run's dataset from ``data_dir`` (default: the folder it trained from), converted once if need be.

    ``purpose`` says in the error what the images were wanted for.
    """
    if "image_dir" in data_settings(checkpoint):
        return _packed_run_data(checkpoint, class_names, data_dir, purpose)
    fmt = recorded_format(checkpoint)
    folder = data_dir or recorded_data_dir(checkpoint) or Path("data")
    if not data_present(folder, fmt):
        without = "" if purpose.startswith("int8") else " (or --eval_limit 0 to export without measuring)"
        raise MissingDataError(
            f"{purpose} needs the run's {fmt.title} images, and {folder} holds neither {fmt.archive_name} nor "
            f"its converted cache; pass --data_dir with the folder that holds them{without}"
        )
    verify = bool(data_settings(checkpoint).get("verify_checksum", True))
    try:
        cache = prepare(folder, fmt, download=False, verify_checksum=verify)
    except DataError as error:
        raise MissingDataError(f"{purpose}: {error}") from error
    if list(cache.class_names) != list(class_names):
        raise MissingDataError(
            f"the data in {folder} has other classes than the model ({len(cache.class_names)} vs "
            f"{len(class_names)}: {list(cache.class_names)[:3]}... vs {list(class_names)[:3]}...); "
            "pass --data_dir with the data the run trained on"
        )
    train, test = cache.split("train"), cache.split("test")
    return RunData(
        name=fmt.name,
        data_dir=folder,
        train_images=np.load(train.images, mmap_mode="r"),
        test_images=np.load(test.images, mmap_mode="r"),
        test_labels=np.load(test.labels),
    )


def _packed_run_data(checkpoint: dict, class_names: list[str], data_dir: Path | None, purpose: str) -> RunData:
    """The packed copy the run trained from (or ``data_dir``, another copy of the same images), split as the run did."""
    settings = data_settings(checkpoint)
    state = checkpoint.get(ImageFolderDataModule.__qualname__, {})
    recorded = state.get("packed_copy")
    folder = data_dir or (Path(recorded) if recorded else None)
    packed = open_packed(folder) if folder is not None else None
    if packed is None:
        without = "" if purpose.startswith("int8") else " (or --eval_limit 0 to export without measuring)"
        raise MissingDataError(
            f"{purpose} needs the packed copy of the run's images, and {folder or 'the checkpoint'} holds none; run "
            f"fit once on {settings.get('image_dir')} to pack them again, or pass --data_dir with the packed copy "
            f"(a folder under data.cache_dir){without}"
        )
    if packed.class_names != list(class_names):
        raise MissingDataError(
            f"the packed copy {packed.root} has other classes than the model ({len(packed.class_names)} vs "
            f"{len(class_names)}); pass --data_dir with the packed copy the run trained on"
        )
    return _held_out(packed, settings)


def _held_out(packed: PackedImages, settings: dict) -> RunData:
    train = packed.split("train")
    train_images = np.load(train.images, mmap_mode="r")
    labels = np.load(train.labels)
    given_val, given_test = "val" in packed.splits, "test" in packed.splits
    fractions = (
        0.0 if given_val else settings.get("val_fraction", 0.1),
        0.0 if given_test else settings.get("test_fraction", 0.0),
    )
    train_rows, val_rows, test_rows = stratified_split(labels, fractions, settings.get("split_seed", 0))
    name = f"images:{Path(packed.meta['source']).name}"
    calibration = Rows(train_images, train_rows)  # never a held-out image
    for split, given, rows in (("test", given_test, test_rows), ("val", given_val, val_rows)):
        if given:
            arrays = packed.split(split)
            return RunData(
                name, packed.root, calibration, np.load(arrays.images, mmap_mode="r"), np.load(arrays.labels), split
            )
        if len(rows):
            return RunData(name, packed.root, calibration, Rows(train_images, rows), labels[rows], split)
    raise MissingDataError(f"the packed copy {packed.root} has no held-out images to judge the export on")
