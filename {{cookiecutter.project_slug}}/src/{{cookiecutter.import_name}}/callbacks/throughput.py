"""Images per second, through Lightning's own ``ThroughputMonitor``, timed at the logger's steps only."""

from __future__ import annotations

import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ThroughputMonitor
from lightning.pytorch.trainer.states import RunningStage, TrainerFn
from lightning.pytorch.utilities import rank_zero_only
from typing_extensions import override


def images_in_batch(batch: Any) -> int:
    """Batches are ``(images, labels)``."""
    return int(batch[0].shape[0])


class ImageThroughput(ThroughputMonitor):
    """Logs ``train/device/samples_per_sec`` (images/s per device) and ``batches_per_sec``, also for validation.

    Under DDP it adds ``train/samples_per_sec``, the rate over all devices. Lightning's monitor reads
    the clock after every training batch, and on a GPU it first waits for the batch to finish
    (``torch.cuda.synchronize``), so the host cannot queue the next step while the GPU works. Here
    the batches are counted on the host and the clock is read only at the steps the logger writes,
    and before each validation (whose time Lightning leaves out of the training rate).
    """

    def __init__(self, window_size: int = 2) -> None:
        """Configure the averaging.

        Args:
            window_size: Logged steps the training rates are averaged over (2: since the previous one);
                validation rates over this many batches.
        """
        super().__init__(batch_size_fn=images_in_batch, window_size=window_size)
        self._module_has_flops = False  # FLOPs are reported once at fit start instead
        self._clocked_batches = 0  # training batches counted at the last clock reading

    @override
    @rank_zero_only
    def on_train_start(self, trainer: L.Trainer, *args: Any) -> None:
        super().on_train_start(trainer, *args)
        self._clocked_batches = 0

    @override
    @rank_zero_only
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, *_: Any
    ) -> None:
        # A step with gradient accumulation still pending is not timed: its optimizer step has not run.
        if trainer._logger_connector.should_update_logs and not trainer.fit_loop._should_accumulate():
            super().on_train_batch_end(trainer, pl_module, outputs, batch)
            self._clocked_batches = self._batches[RunningStage.TRAINING]
            return
        stage = trainer.state.stage
        self._samples[stage] += self.batch_size_fn(batch)
        self._batches[stage] += 1

    @override
    @rank_zero_only
    def on_validation_start(self, trainer: L.Trainer, *args: Any) -> None:
        # Lightning resumes the training clock where its last reading left off; read it now for the
        # batches since the last logging step, or their time would be dropped with the validation's.
        training = RunningStage.TRAINING
        if (
            trainer.state.fn == TrainerFn.FITTING
            and not trainer.sanity_checking
            and self._batches.get(training, 0) > self._clocked_batches
        ):
            if trainer.strategy.root_device.type == "cuda":
                torch.cuda.synchronize()  # once per validation, as the monitor does before each reading
            self._throughputs[training].update(
                time=time.perf_counter() - self._t0s[training],
                batches=self._batches[training],
                samples=self._samples[training],
            )
            self._clocked_batches = self._batches[training]
        super().on_validation_start(trainer, *args)
