"""Find the TensorBoard writers among the trainer's loggers, warning once when there are none."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.tensorboard import SummaryWriter


def tensorboard_writers(trainer: L.Trainer, owner: object, what: str) -> list[SummaryWriter]:
    """The ``SummaryWriter`` of every TensorBoard logger; warns once per ``owner`` if there is none."""
    writers = [logger.experiment for logger in trainer.loggers if isinstance(logger, TensorBoardLogger)]
    if not writers and not getattr(owner, "_warned_no_tensorboard", False):
        rank_zero_warn(f"{type(owner).__name__}: no TensorBoardLogger attached, so {what} are not logged.")
        owner._warned_no_tensorboard = True
    return writers
