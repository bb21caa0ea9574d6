"""The data path: images → packed memory-mapped arrays → uint8 batches → augmentation on the device.

The names are imported when first used: decoding a file (``image_files``, ``preprocessing``) needs no torch, so a
server that only decodes (``serving/``) runs without it.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "ImageDataModule": ".datamodule",
    "ImageFolderDataModule": ".folder",
    "BatchPlan": ".interfaces",
    "DataSummary": ".interfaces",
    "Fingerprinted": ".interfaces",
    "PredictionNames": ".interfaces",
    "TrainingImages": ".interfaces",
    "ValidationSplit": ".interfaces",
    "StreamedImageDataModule": ".streams.datamodule",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_NAMES[name], __name__), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_NAMES])
