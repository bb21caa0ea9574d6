"""The run's own dataset, found from its checkpoint: training images to calibrate int8, the test split to judge.

An exported model is judged on the images it was trained for, not on noise: the dataset and
its checksum setting come from the data settings the checkpoint records, the folder from
``--data_dir`` (by default the folder the run trained from). Nothing is downloaded: an export
runs where the data already is, and says so in one line when it is not.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...data.archive import archive_path, load_cache, prepare
from ...data.cifar_format import FORMATS, CifarFormat
from ...data.errors import DataError
from ..errors import UsageError


class MissingDataError(UsageError):
    """The images an export step needs are not where it looked; the message names the folder to pass."""


@dataclass(frozen=True)
class RunData:
    """Memory-mapped uint8 (N, 3, 32, 32) images and int64 labels of one converted dataset."""

    fmt: CifarFormat
    data_dir: Path
    train_images: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray


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
        fmt=fmt,
        data_dir=folder,
        train_images=np.load(train.images, mmap_mode="r"),
        test_images=np.load(test.images, mmap_mode="r"),
        test_labels=np.load(test.labels),
    )
