"""The data path: images → packed memory-mapped arrays → uint8 batches → augmentation on the device."""

from .datamodule import ImageDataModule
from .folder import ImageFolderDataModule
from .interfaces import BatchPlan, DataSummary, Fingerprinted, PredictionNames, TrainingImages, ValidationSplit
from .streams.datamodule import StreamedImageDataModule

__all__ = [
    "BatchPlan",
    "DataSummary",
    "Fingerprinted",
    "ImageDataModule",
    "ImageFolderDataModule",
    "PredictionNames",
    "StreamedImageDataModule",
    "TrainingImages",
    "ValidationSplit",
]
