"""The data path: archive → memory-mapped arrays → uint8 batches → augmentation on the device."""

from .datamodule import CifarDataModule

__all__ = ["CifarDataModule"]
