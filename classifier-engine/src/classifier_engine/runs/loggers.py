"""The loggers and callbacks a config names, and which loggers place a run and which track it.

Said once here: a directory logger (TensorBoard, CSV) writes into ``save_dir/name/version`` and so
places the run's folder; a tracker (MLflow, W&B) is a service whose package is an optional extra.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch.loggers import CSVLogger, MLFlowLogger, TensorBoardLogger, WandbLogger

from ..foundation.errors import UsageError

DIRECTORY_LOGGERS = (TensorBoardLogger, CSVLogger)
# tracker class -> (the module it needs, the extra of pyproject.toml that installs it)
TRACKERS = {MLFlowLogger: ("mlflow", "mlflow"), WandbLogger: ("wandb", "wandb")}


def loggers(trainer: Namespace) -> list[Namespace]:
    """The configured loggers (``trainer.logger`` is one or a list), as class_path/init_args namespaces."""
    logger = trainer.get("logger")
    return [item for item in (logger if isinstance(logger, list) else [logger]) if isinstance(item, Namespace)]


def callbacks(trainer: Namespace) -> list[Namespace]:
    """The configured callbacks, as class_path/init_args namespaces."""
    return [item for item in trainer.get("callbacks") or [] if isinstance(item, Namespace) and "class_path" in item]


def class_of(item: Namespace) -> type:
    """The class a ``class_path`` namespace names (a logger, a callback, a plugin, a sampler, ...)."""
    module, _, name = str(item.class_path).rpartition(".")
    return getattr(importlib.import_module(module), name)


def is_directory_logger(logger: Any) -> bool:
    """A configured logger that writes into ``save_dir/name/version`` (TensorBoard, CSV): it places the run."""
    return isinstance(logger, Namespace) and issubclass(class_of(logger), DIRECTORY_LOGGERS)


def experiment_dir(trainer: Namespace) -> Path:
    """The folder holding one directory per run: the first TensorBoard (or CSV) logger's ``save_dir/name``, or ``runs``.

    A relative ``save_dir`` lies under ``trainer.default_root_dir`` when that is given.
    """
    root = Path(trainer.get("default_root_dir") or ".")
    for logger in loggers(trainer):
        if is_directory_logger(logger):
            args = logger.init_args
            return root / str(args.save_dir) / str(args.get("name") or "")
    return root / "runs"


def is_tracker(logger: Any) -> bool:
    """A logger object (not a config) that sends the run to a tracking service."""
    return isinstance(logger, tuple(TRACKERS))


def check_tracker_packages(trainer: Namespace) -> None:
    """A tracker's logger without its package: one line naming the pip command (Lightning's says less)."""
    for logger in loggers(trainer):
        kind = class_of(logger)
        for tracker, (module, extra) in TRACKERS.items():
            if issubclass(kind, tracker):
                try:
                    importlib.import_module(module)
                except ImportError:
                    message = f"{kind.__name__} needs {module}, which is not installed; pip install -e '.[{extra}]'"
                    raise UsageError(message) from None
