"""The data path: archive → memory-mapped arrays → uint8 batches → augmentation on the device."""

from .datamodule import CifarDataModule
from .interfaces import BatchPlan, Fingerprinted, PredictionNames, TrainingImages, ValidationSplit

__all__ = [
    "BatchPlan",
    "CifarDataModule",
    "Fingerprinted",
    "PredictionNames",
    "TrainingImages",
    "ValidationSplit",
]
