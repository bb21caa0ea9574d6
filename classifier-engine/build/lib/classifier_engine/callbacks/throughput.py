"""Images per second, with Lightning's ``Throughput`` (the windowed rates), timed at the logger's steps only."""

from __future__ import annotations

import time
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.throughput import Throughput
from lightning.pytorch.trainer.states import TrainerFn
from typing_extensions import override

from ..foundation.logging_steps import at_logging_step, metrics_step

# What Throughput computes that is logged: per device, and over all devices under DDP.
RATES = ("device/samples_per_sec", "device/batches_per_sec", "samples_per_sec", "batches_per_sec")


def images_in_batch(batch: Any) -> int:
    """Batches are ``(images, labels)``."""
    return int(batch[0].shape[0])


class ImageThroughput(L.Callback):
    """Logs ``train/device/samples_per_sec`` (images/s per device) and ``batches_per_sec``; ``val/device/*`` too.

    Under DDP it adds ``train/samples_per_sec``, the rate over all devices. Lightning's
    ``ThroughputMonitor`` reads the clock after every training batch, and on a GPU it first waits for
    the batch to finish (``torch.cuda.synchronize``), so the host cannot queue the next step while
    the GPU works. Here the batches are counted on the host and the clock is read only at the steps
    the logger writes and around each validation, whose time is left out of the training rate.
    """

    def __init__(self, window_size: int = 2) -> None:
        """Configure the averaging.

        Args:
            window_size: Clock readings the training rates are averaged over (2: since the previous one).
        """
        self.window_size = window_size
        self._training: Throughput | None = None
        self._trained = 0.0  # training seconds up to the start of the current stretch (validations left out)
        self._stretch_start: float | None = None  # clock at the start of the current training stretch
        self._images = self._batches = 0  # training, this fit
        self._clocked_batches = 0  # training batches at the last clock reading
        self._last_step = 0
        self._validation_start = 0.0
        self._validation_images = self._validation_batches = 0

    @staticmethod
    def _now(trainer: L.Trainer) -> float:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize()  # what was queued is part of the time
        return time.perf_counter()

    @staticmethod
    def _log(trainer: L.Trainer, metrics: dict[str, float]) -> None:
        """Straight to the loggers, as Lightning's monitor does: a rate is not a result (not in callback_metrics)."""
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=metrics_step(trainer))

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._training = Throughput(window_size=self.window_size, world_size=trainer.world_size)

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._training.reset()
        self._trained, self._images, self._batches, self._clocked_batches = 0.0, 0, 0, 0
        self._last_step = trainer.global_step
        self._stretch_start = self._now(trainer)

    def _read_clock(self, now: float) -> None:
        if self._batches > self._clocked_batches:  # a reading without new batches would add no time
            elapsed = self._trained + now - self._stretch_start
            self._training.update(time=elapsed, batches=self._batches, samples=self._images)
            self._clocked_batches = self._batches

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        self._images += images_in_batch(batch)
        self._batches += 1
        stepped = trainer.global_step != self._last_step  # not while gradients are still being accumulated
        self._last_step = trainer.global_step
        if stepped and at_logging_step(trainer):
            self._read_clock(self._now(trainer))
            rates = self._training.compute()
            logged = {f"train/{name}": rates[name] for name in RATES if name in rates}
            if logged:  # once the window holds two readings
                self._log(trainer, logged)

    @override
    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        now = self._now(trainer)
        if self._stretch_start is not None:  # a validation inside fit: the training batches so far keep their time
            self._read_clock(now)
            self._trained += now - self._stretch_start
            self._stretch_start = None
        self._validation_start, self._validation_images, self._validation_batches = now, 0, 0

    @override
    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, *args) -> None:
        if not trainer.sanity_checking:
            self._validation_images += images_in_batch(batch)
            self._validation_batches += 1

    @override
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or self._validation_batches == 0:
            return
        now = self._now(trainer)
        seconds = max(now - self._validation_start, 1e-9)
        rates = {
            "val/device/samples_per_sec": self._validation_images / seconds,
            "val/device/batches_per_sec": self._validation_batches / seconds,
        }
        self._log(trainer, rates)
        if trainer.state.fn == TrainerFn.FITTING:
            self._stretch_start = now  # training resumes; the validation's time stays out of its rate
