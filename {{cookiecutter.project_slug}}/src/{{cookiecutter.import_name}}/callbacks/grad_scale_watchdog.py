"""Watch the fp16 loss scale; stop cleanly, with a checkpoint, when training has diverged.

With fp16 mixed precision the GradScaler skips every step whose gradients overflow and halves
its scale. A few skips are normal; a long run of them means training has gone non-finite and
every further step is wasted. Skips are detected by the scale dropping across ``update()``:
the scale used for a step is read in ``on_before_optimizer_step`` and the updated one in
``on_train_batch_end``. Without a scaler (fp32, bf16) only the loss is watched.
"""

from __future__ import annotations

import math
from collections import deque
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor

CAUSES = (
    "usual causes: a learning rate that is too high (lower model.optimizer.init_args.lr or lengthen the warm-up), "
    "a loss computed in fp16 instead of fp32, or a layer whose activations overflow fp16 (try bf16-mixed)"
)


class GradScaleWatchdog(L.Callback):
    """Log ``amp/scale`` and ``amp/skipped_steps``; warn, and stop after consecutive skipped steps."""

    def __init__(
        self,
        scale_floor: float = 1.0,
        max_skip_rate: float = 0.05,
        window: int = 200,
        max_consecutive_skips: int = 25,
    ) -> None:
        """Configure the thresholds.

        Args:
            scale_floor: Warn when the loss scale falls below this value.
            max_skip_rate: Warn when more than this fraction of the last ``window`` steps were skipped.
            window: Number of recent optimizer steps the skip rate is measured over.
            max_consecutive_skips: Save a checkpoint and stop after this many skipped steps in a row (0: never stop).
        """
        self.scale_floor = scale_floor
        self.max_skip_rate = max_skip_rate
        self.window = window
        self.max_consecutive_skips = max_consecutive_skips
        self.skipped_steps = 0
        self.consecutive_skips = 0
        self.stop_checkpoint: Path | None = None
        self._recent: deque[bool] = deque(maxlen=window)
        self._scale_before: float | None = None
        self._warned: set[str] = set()

    @staticmethod
    def _scaler(trainer: L.Trainer):
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        return scaler if scaler is not None and scaler.is_enabled() else None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._scaler(trainer) is None:
            rank_zero_info(
                f"GradScaleWatchdog: precision {trainer.precision!r} uses no loss scaler; "
                "only non-finite losses are watched."
            )

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        scaler = self._scaler(trainer)
        self._scale_before = scaler.get_scale() if scaler is not None else None

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        loss_finite = not isinstance(loss, Tensor) or math.isfinite(float(loss.detach()))
        scaler = self._scaler(trainer)
        if scaler is not None:
            if self._scale_before is None:  # accumulating: no optimizer step on this batch
                return
            scale = scaler.get_scale()
            skipped = scale < self._scale_before or not loss_finite
            pl_module.log("amp/scale", scale, on_step=True, on_epoch=False)
        else:
            scale = None
            skipped = not loss_finite
        self._scale_before = None
        self._count(skipped)
        if scaler is not None:  # without a scaler the count is flat zero until the run stops: not worth a chart
            pl_module.log("amp/skipped_steps", float(self.skipped_steps), on_step=True, on_epoch=False)
        self._check(trainer, scale)

    def _count(self, skipped: bool) -> None:
        self._recent.append(skipped)
        self.skipped_steps += int(skipped)
        self.consecutive_skips = self.consecutive_skips + 1 if skipped else 0

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            rank_zero_warn(message)

    def _check(self, trainer: L.Trainer, scale: float | None) -> None:
        if scale is not None and scale < self.scale_floor:
            self._warn_once(
                "floor", f"GradScaleWatchdog: the fp16 loss scale fell to {scale:g} (< {self.scale_floor:g}); {CAUSES}."
            )
        if len(self._recent) == self.window and sum(self._recent) > self.max_skip_rate * self.window:
            self._warn_once(
                "rate",
                f"GradScaleWatchdog: {sum(self._recent)} of the last {self.window} optimizer steps were skipped "
                f"(> {self.max_skip_rate:.0%}); {CAUSES}.",
            )
        if self.max_consecutive_skips and self.consecutive_skips >= self.max_consecutive_skips:
            self._stop(trainer)

    def _stop(self, trainer: L.Trainer) -> None:
        checkpoint_dir = (
            Path(trainer.checkpoint_callback.dirpath) if trainer.checkpoint_callback else Path(trainer.default_root_dir)
        )
        self.stop_checkpoint = checkpoint_dir / "last.ckpt"
        trainer.save_checkpoint(self.stop_checkpoint)  # collective: every rank calls it, rank 0 writes
        trainer.should_stop = True
        self.consecutive_skips = 0
        rank_zero_warn(
            f"GradScaleWatchdog: stopped training at step {trainer.global_step} after {self.max_consecutive_skips} "
            f"optimizer steps in a row were skipped (non-finite gradients or loss). The state was saved to "
            f"{self.stop_checkpoint}; resume with --ckpt_path last once the cause is fixed. {CAUSES.capitalize()}."
        )

    def state_dict(self) -> dict[str, Any]:
        return {"skipped_steps": self.skipped_steps}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped_steps = int(state_dict["skipped_steps"])
