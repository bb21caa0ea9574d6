"""The engine of an image-classifier project: runs that resume exactly, the data path, export, sweeps, reports.

A project (rendered from the template in this repository) keeps its LightningModule, networks, DataModule,
recipe callbacks and configs, and reaches this library through the names below only: they are its public
API, which semantic versioning covers (with the configs' ``class_path``s of ``classifier_engine`` and the
checkpoints a release writes). ``classifier_engine.testing`` (tiny data for tests) and ``python -m
classifier_engine.torchrun`` are public as well; every other module is the library's own and may change in
any release. A name renamed in a minor release
keeps working under its old name, with a ``DeprecationWarning``, until the next minor release.

The names are imported when first used, so ``import classifier_engine`` stays cheap. This library never
imports a project.
"""

from __future__ import annotations

import importlib
import warnings
from importlib.metadata import version
from typing import Any

__version__ = version("classifier-engine")  # pyproject.toml states it once

# Public name -> module that defines it (relative to this package).
_API: dict[str, str] = {
    # Commands: every entry script calls one as run_<command>(ModelClass, DEFAULT_CONFIG).
    "run_main": ".commands.entry",
    "run_export": ".commands.entry",
    "run_sweep": ".commands.entry",
    "run_check_labels": ".commands.entry",
    "run_cross_validate": ".commands.entry",
    "run_pack": ".commands.entry",
    "run_serve": ".serving.server",  # run_serve(): no model class, no torch
    # The model contract and the parts a model is built from.
    "ClassifierModel": ".contract",
    "LinkedFromData": ".contract",
    "ResumableSchedule": ".contract",
    "model_guarantees": ".cli.model_guarantees",
    "Normalize": ".models.network_parts",
    "SharedRecipe": ".models.network_parts",
    "ScheduleRecipe": ".models.network_parts",
    "head_input": ".models.network_parts",
    "logits_and_features": ".models.network_parts",
    "TorchvisionNet": ".models.torchvision_net",
    "weights_from_checkpoint": ".models.starting_weights",
    "parameter_groups": ".models.parameter_groups",
    "build_optimizer": ".models.parameter_groups",
    "check_lr_scales": ".models.parameter_groups",
    "Calibration": ".models.calibration",
    "DomainScore": ".models.domain",
    "ClassWeights": ".models.labels",
    "LossFactory": ".models.labels",
    "Task": ".models.labels",
    "build_loss": ".models.labels",
    "evaluation_metrics": ".models.labels",
    "is_imbalanced": ".models.labels",
    "loss_weights": ".models.labels",
    # Data: the DataModules, their parts, and what other parts may ask of a DataModule.
    "ImageDataModule": ".data.datamodule",
    "RESIZED_CROP_FROM": ".data.datamodule",
    "ImageFolderDataModule": ".data.folder",
    "stratified_split": ".data.folder",
    "StreamedImageDataModule": ".data.streams.datamodule",
    "BatchAugment": ".data.augment",
    "MemmapBatches": ".data.dataset",
    "decode_image": ".data.image_files",
    "Cache": ".data.archive",
    "fingerprint": ".data.archive",
    "load_cache": ".data.archive",
    "prepare": ".data.archive",
    "CIFAR_FORMATS": ".data.cifar_format",
    "counted": ".data.folder_size",
    "head_epochs_for": ".data.folder_size",
    "TrainingImages": ".data.interfaces",
    "DataError": ".data.errors",
    "DataSettingError": ".data.errors",
    # Callbacks a config lists, and what recipe callbacks use.
    "ConfusionMatrix": ".callbacks.confusion_matrix",
    "EvaluationReport": ".callbacks.evaluation_report",
    "ImageThroughput": ".callbacks.throughput",
    "LinearProbe": ".callbacks.linear_probe",
    "ModelReport": ".callbacks.model_report",
    "PredictionWriter": ".callbacks.prediction_writer",
    "SampleGrid": ".callbacks.sample_grid",
    "tensorboard_writers": ".callbacks.tensorboard",
    "at_logging_step": ".foundation.logging_steps",
    # Mistakes reported in one line.
    "UsageError": ".foundation.errors",
    "check_choice": ".foundation.errors",
}
# Where a name's definition is called otherwise than its public name.
_DEFINED_AS = {"CIFAR_FORMATS": "FORMATS"}
# Old public name -> new one, kept for one minor release (each use warns).
_RENAMED: dict[str, str] = {"RejectionScore": "DomainScore"}

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    if name in _RENAMED:
        new = _RENAMED[name]
        warnings.warn(
            f"classifier_engine.{name} is now classifier_engine.{new}; the old name goes in the next minor release",
            DeprecationWarning,
            stacklevel=2,
        )
        return __getattr__(new)
    if name not in _API:
        raise AttributeError(f"module 'classifier_engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(_API[name], __name__), _DEFINED_AS.get(name, name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
