"""Find the TensorBoard writers among the trainer's loggers."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.tensorboard import SummaryWriter


def tensorboard_writers(trainer: L.Trainer, owner: object, what: str) -> list[SummaryWriter]:
    """The ``SummaryWriter`` of every TensorBoard logger; warns once per ``owner`` if there is none."""
    writers = [logger.experiment for logger in trainer.loggers if isinstance(logger, TensorBoardLogger)]
    quiet = bool(trainer.fast_dev_run) or getattr(owner, "_warned_no_tensorboard", False)  # fast_dev_run logs nothing
    if not writers and not quiet:
        rank_zero_warn(f"{type(owner).__name__}: no TensorBoardLogger attached, so {what} are not logged.")
        owner._warned_no_tensorboard = True
    return writers
