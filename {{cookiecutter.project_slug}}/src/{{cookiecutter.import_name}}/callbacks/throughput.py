"""Images per second, through Lightning's own ``ThroughputMonitor``."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import ThroughputMonitor


def images_in_batch(batch: Any) -> int:
    """Batches are ``(images, labels)``."""
    return int(batch[0].shape[0])


class ImageThroughput(ThroughputMonitor):
    """Logs ``train/device/samples_per_sec`` (images/s per device) and ``batches_per_sec``, also for validation.

    Under DDP it adds ``train/samples_per_sec``, the rate over all devices.
    """

    def __init__(self, window_size: int = 10) -> None:
        """Configure the averaging.

        Args:
            window_size: Number of batches the rates are averaged over.
        """
        super().__init__(batch_size_fn=images_in_batch, window_size=window_size)
        self._module_has_flops = False  # FLOPs are reported once at fit start instead
