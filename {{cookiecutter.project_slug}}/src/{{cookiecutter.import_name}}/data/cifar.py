"""CIFAR-10/100: the official archive, checked and converted once, served by the fast path (``datamodule.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
from typing_extensions import override

from classifier_engine import (
    CIFAR_FORMATS,
    Cache,
    DataError,
    DataSettingError,
    ImageDataModule,
    MemmapBatches,
    fingerprint,
    load_cache,
    prepare,
)


class CifarDataModule(ImageDataModule):
    """CIFAR batches as uint8 (N, 3, 32, 32) tensors, with a fixed, seeded validation split of the training images."""

    def __init__(
        self,
        dataset: Literal["cifar10", "cifar100"] = "{{ 'cifar10' if cookiecutter.dataset == 'images' else cookiecutter.dataset }}",
        data_dir: str = "data",
        val_size: int = 5000,
        split_seed: int = 0,
        download: bool = True,
        verify_checksum: bool = True,
        class_names: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        """Configure the data.

        Args:
            dataset: Which archive to use; its official file name is looked for in ``data_dir``.
            data_dir: Folder holding the archive (downloaded there if absent) and its converted cache.
            val_size: Training images held out for validation; 0 validates on the test set instead.
            split_seed: Seed of the fixed train/validation split (independent of the run's seed).
            download: Download the official archive when it is not in ``data_dir``.
            verify_checksum: Check the archive's MD5 against the official one; false to use your own CIFAR-format data.
            class_names: Class names of your own CIFAR-format data; defaults to the official names.
            **kwargs: How batches are served and augmented (``ImageDataModule``).
        """
        super().__init__(**kwargs)
        if dataset not in CIFAR_FORMATS:
            raise ValueError(f"data.dataset must be one of {sorted(CIFAR_FORMATS)}, got {dataset!r}")
        if val_size < 0:
            raise ValueError(f"data.val_size must be 0 or more, got {val_size}")
        self.format = CIFAR_FORMATS[dataset]
        self.title = self.format.title
        self.data_dir = Path(data_dir)
        self.val_size = val_size
        self.split_seed = split_seed
        self.download = download
        self.verify_checksum = verify_checksum
        self.class_names = list(class_names or self.format.class_names)
        self.mean = self.format.mean
        self.std = self.format.std
        self.image_size = 32
        self.resize = "stretch"  # your own images for predict, to CIFAR's 32x32 (CIFAR's own were made so)
        self.cache: Cache | None = None

    @classmethod
    def data_fingerprint(cls, settings: Mapping[str, Any], stage: str) -> str:
        """The dataset's name and its archive's MD5; for ``predict`` on your own images, their folder.

        Checked before anything is built: data that is neither here nor to be downloaded is refused at once.
        """
        if stage == "predict" and settings.get("predict_dir"):
            return f"images:{settings['predict_dir']}"  # no CIFAR archive is needed, or looked for
        return fingerprint(
            Path(settings.get("data_dir", "data")),
            CIFAR_FORMATS[settings.get("dataset", "cifar10")],
            download=settings.get("download", True),
            verify_checksum=settings.get("verify_checksum", True),
        )

    @override
    def use_data_dir(self, folder: Path) -> None:
        """Read the archive or its converted cache from ``folder`` (``export.py --data_dir``)."""
        self.data_dir = Path(folder)

    @override
    def prepare_data(self) -> None:
        if not self.predicting_own_images():  # your own images need no archive
            download = self.download and not self.offline  # export.py reads the archive that is there
            prepare(self.data_dir, self.format, download=download, verify_checksum=self.verify_checksum)

    @override
    def setup(self, stage: str) -> None:
        if stage == "predict" and self.predict_dir is not None:
            self.setup_own_predictions()
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
        val_size = 0 if self.folds else self.val_size  # cross-validating, the fold held out is the validation
        order = np.random.default_rng(self.split_seed).permutation(num_train)
        held_out, kept = np.sort(order[:val_size]), np.sort(order[val_size:])
        test_split = self.cache.split("test")
        test = MemmapBatches(test_split.images, test_split.labels)
        val = MemmapBatches(train.images, train.labels, held_out) if val_size else test
        self.serve(stage, MemmapBatches(train.images, train.labels, kept, with_ids=True), val, test)

    @property
    @override
    def validates_on_test_set(self) -> bool:
        return self.val_size == 0 and not self.folds
