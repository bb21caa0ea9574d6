"""The data path: archive → memory-mapped arrays → uint8 batches → augmentation on the device."""

from .datamodule import CifarDataModule
from .interfaces import BatchPlan, PredictionNames, TrainingImages, ValidationSplit

__all__ = ["BatchPlan", "CifarDataModule", "PredictionNames", "TrainingImages", "ValidationSplit"]
