"""Find the TensorBoard writers among the trainer's loggers, and the step that lines up with Lightning's own."""

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


def at_logging_step(trainer: L.Trainer) -> bool:
    """Whether the logger writes this step, asked in ``on_train_batch_end`` after an optimizer step.

    Lightning's own answer (its logger connector's ``should_update_logs``) is private; this is the same
    rule from public attributes: ``global_step`` already counts the step just taken.
    """
    every = trainer.log_every_n_steps
    return trainer.should_stop or (every > 0 and trainer.global_step % every == 0)


def metrics_step(trainer: L.Trainer) -> int:
    """The step Lightning logs epoch-level metrics (``val/*``) at, so that figures and extra scalars line up.

    Lightning logs them at its count of optimizer steps taken before the current one, which is
    one less than ``trainer.global_step`` during training.
    """
    # Private, with no public route: the counter Lightning itself logs at (tests/test_private_routes.py).
    return trainer.fit_loop.epoch_loop._batches_that_stepped
