"""Images per second, through Lightning's own ``ThroughputMonitor``, timed at the logger's steps only."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ThroughputMonitor
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
    the batches are counted on the host and the clock is read only at the steps the logger writes.
    """

    def __init__(self, window_size: int = 2) -> None:
        """Configure the averaging.

        Args:
            window_size: Logged steps the training rates are averaged over (2: since the previous one);
                validation rates over this many batches.
        """
        super().__init__(batch_size_fn=images_in_batch, window_size=window_size)
        self._module_has_flops = False  # FLOPs are reported once at fit start instead

    @override
    @rank_zero_only
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, *_: Any
    ) -> None:
        # A step with gradient accumulation still pending is not timed: its optimizer step has not run.
        if trainer._logger_connector.should_update_logs and not trainer.fit_loop._should_accumulate():
            super().on_train_batch_end(trainer, pl_module, outputs, batch)
            return
        stage = trainer.state.stage
        self._samples[stage] += self.batch_size_fn(batch)
        self._batches[stage] += 1
