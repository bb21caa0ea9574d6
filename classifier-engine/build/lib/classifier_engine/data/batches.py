"""The batch sizes a run trains and evaluates with, derived in one place from the settings and the world it runs in.

The settings say what the user means: ``batch_size`` per device and forward pass, or
``global_batch_size`` per optimizer step (over all devices and accumulated batches), and an
optional ``eval_batch_size``. What the loaders and the reports need follows from them once the
number of devices and ``trainer.accumulate_grad_batches`` are known.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import DataSettingError


@dataclass(frozen=True)
class BatchSizes:
    """Images per device and forward pass (training and evaluation), and per optimizer step."""

    per_device: int
    eval_per_device: int
    devices: int
    accumulated: int

    @property
    def per_step(self) -> int:
        """Training images behind one optimizer step: per device x devices x accumulated batches."""
        return self.per_device * self.devices * self.accumulated

    @classmethod
    def derive(
        cls,
        batch_size: int,
        global_batch_size: int | None,
        eval_batch_size: int | None,
        devices: int = 1,
        accumulated: int = 1,
    ) -> BatchSizes:
        if global_batch_size is None:
            per_device = batch_size
        else:
            share = devices * accumulated
            if global_batch_size % share:
                raise DataSettingError(
                    f"data.global_batch_size={global_batch_size} does not divide over {devices} devices x "
                    f"{accumulated} accumulated batches; use a multiple of {share}, or set data.batch_size "
                    "per device instead"
                )
            per_device = global_batch_size // share
        return cls(per_device, eval_batch_size or per_device, devices, accumulated)

    def describe(self) -> str:
        parts = [f"{self.per_device} per device"]
        if self.devices > 1:
            parts.append(f"{self.devices} devices")
        if self.accumulated > 1:
            parts.append(f"{self.accumulated} accumulated batches")
        return f"{' x '.join(parts)} = {self.per_step} images per optimizer step"
