"""A diverged run ends as a failure, at the step its loss stopped being finite, and never checkpoints a NaN model.

With too high a learning rate the loss turns NaN and, in full precision, so do the weights a step
later; every further step is wasted, and a checkpoint written then would make ``--ckpt_path last``
resume from NaN. ``DivergenceGuard`` (installed by the CLI whatever the config's callbacks say)
keeps, on the device, the step at which the current run of non-finite losses began and its length,
and reads them on the host every ``CHECK_EVERY_N_STEPS`` steps and before every checkpoint. It stops
the run with ``DivergedError`` once the weights themselves are not finite, or after
``safety.max_nonfinite_steps`` steps in a row with a non-finite loss (fp16's loss scaler recovers
from an occasional one). The checkpoint writer refuses non-finite weights on its own as well
(``checkpoint_io.NonFiniteWeightsError``).

It also decides whether the checkpoint Lightning writes when an exception ends training
(``save_on_exception``) may be written: not after a divergence or a full disk, and not when the
error struck inside the optimizer's update (a CUDA out-of-memory error there leaves half-updated
weights). A save it allows holds the last completed step.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import Tensor
from typing_extensions import override

from ..checkpoints.checkpoint_io import non_finite_weights
from ..foundation.files import is_full_disk

CHECK_EVERY_N_STEPS = 10  # host reads of the device counts; a GPU never waits on a step in between


class DivergedError(FloatingPointError):
    """Training diverged: the loss stopped being finite at ``first_step`` (the optimizer step, counted from 1)."""

    def __init__(self, first_step: int, steps: int, weights_finite: bool) -> None:
        self.first_step, self.steps, self.weights_finite = first_step, steps, weights_finite
        state = "the weights are finite" if weights_finite else "the weights are no longer finite"
        super().__init__(
            f"the loss stopped being finite at step {first_step} and stayed so for {steps} steps ({state})"
        )


class DivergenceGuard(L.Callback):
    """Stop a run whose loss stopped being finite; veto checkpoints that would not hold the last good state."""

    def __init__(self, max_nonfinite_steps: int = 25) -> None:
        self.max_nonfinite_steps = max_nonfinite_steps
        self.check_every_n_steps = CHECK_EVERY_N_STEPS
        self.first_step: int | None = None  # the step the current run of non-finite losses began at, once read
        self.nonfinite_steps = 0
        self.stepping = False  # inside the optimizer's update
        self.ending = False  # an exception is ending training
        self._device: dict[str, Tensor] = {}
        self._unread = 0

    @override
    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        self.stepping = True

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.stepping = False
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if not isinstance(loss, Tensor):
            return
        bad = ~torch.isfinite(loss.detach())
        if not self._device:
            none = torch.full((), -1, dtype=torch.int64, device=loss.device)
            self._device = {"first": none, "run": torch.zeros((), dtype=torch.int64, device=loss.device)}
        run, first = self._device["run"], self._device["first"]
        # global_step has counted this batch's step already: the step whose loss this was, from 1.
        step = torch.full_like(first, trainer.global_step)
        self._device = {
            "run": (run + 1) * bad,
            "first": torch.where(bad, torch.where(first < 0, step, first), torch.full_like(first, -1)),
        }
        self._unread += 1
        if self._unread >= self.check_every_n_steps:
            self.check(trainer, pl_module)

    def _read(self) -> None:
        if self._device:
            self.nonfinite_steps, first = torch.stack([self._device["run"], self._device["first"]]).tolist()
            self.first_step = first if first >= 0 else None
        self._unread = 0

    def check(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Raise ``DivergedError`` if the weights are not finite, or the loss has not been for too many steps.

        Every rank checks at the same step and they agree (one all-reduce), so all of them stop together.
        """
        self._read()
        weights_finite = not self.nonfinite_steps or not non_finite_weights(pl_module.state_dict())
        diverged = self.nonfinite_steps > 0 and (not weights_finite or self.nonfinite_steps >= self.max_nonfinite_steps)
        if trainer.world_size > 1:
            votes = torch.tensor([int(diverged), self.first_step or 0], device=trainer.strategy.root_device)
            diverged, first = (int(value) for value in trainer.strategy.reduce(votes, reduce_op="max").tolist())
            self.first_step = self.first_step or first or None
        if diverged:
            raise DivergedError(self.first_step or trainer.global_step, self.nonfinite_steps, weights_finite)

    @override
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        if not self.ending:  # a save as an exception ends training was judged in on_exception (no collective there)
            self.check(trainer, pl_module)  # raised before a byte is written

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        # Lightning runs the checkpoint callbacks' on_exception after this one.
        self.ending = True
        try:
            self._read()
        except RuntimeError:  # a device in a bad state: its counts cannot be trusted
            self.nonfinite_steps = 1
        unsafe = (
            isinstance(exception, FloatingPointError)
            or is_full_disk(exception, trainer.default_root_dir)
            or (self.stepping and isinstance(exception, torch.OutOfMemoryError))
            or self.nonfinite_steps > 0
        )
        if unsafe:
            for callback in trainer.checkpoint_callbacks:
                if isinstance(callback, ModelCheckpoint):
                    callback.save_on_exception = False
