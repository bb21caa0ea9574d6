"""``fit --recipe probe``: the config's run with the linear probe alone, as an ordinary run of one step."""

from __future__ import annotations

from typing import Literal

from lightning.pytorch import Trainer

from ..callbacks.linear_probe import LinearProbe
from ..foundation.errors import UsageError

Recipe = Literal["finetune", "probe"]


def probe_alone(trainer: Trainer) -> None:
    """Make the built trainer's run the probe alone: its ``LinearProbe`` without the fine-tune, and one epoch of one
    validated step, whose update the probe drops, so the run validates, calibrates and checkpoints.

    The trainer is set, not the config: the run's ``config.yaml`` is the command as typed (``recipe: probe``), so
    the same command names the same run.
    """
    probes = [callback for callback in trainer.callbacks if isinstance(callback, LinearProbe)]
    if not probes:
        raise UsageError(
            "--recipe probe needs classifier_engine.callbacks.LinearProbe in trainer.callbacks; add it "
            "(configs/images.yaml lists it), or leave --recipe out"
        )
    for probe in probes:
        probe.fine_tune = False
    trainer.fit_loop.max_epochs, trainer.fit_loop.epoch_loop.max_steps = 1, -1
    trainer.limit_train_batches, trainer.check_val_every_n_epoch, trainer.val_check_interval = 1, 1, 1.0
