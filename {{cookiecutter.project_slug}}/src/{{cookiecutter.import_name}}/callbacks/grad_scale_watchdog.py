"""Watch the fp16 loss scale; end the run as diverged when the scaler keeps skipping steps.

With fp16 mixed precision the GradScaler skips every step whose gradients overflow and halves
its scale. A few skips are normal; a long run of them means training has gone non-finite and
every further step is wasted. Skips are detected by the scale dropping across ``update()``
(the scale used for a step is taken in ``on_before_optimizer_step``, the updated one in
``on_train_batch_end``). Without a scaler (fp32, bf16) only the loss is watched.

Every comparison stays on the device: the counts are read on the host only every
``check_every_n_steps`` steps, so the step path never waits for the GPU. A stop therefore
comes at the first check after ``max_consecutive_skips`` skipped steps in a row. It raises
``FloatingPointError``: the run ends as a failure (exit status 1, one line saying so), and no
checkpoint is written then, so ``--ckpt_path last`` resumes the last state saved before.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor
from typing_extensions import override

from classifier_engine import at_logging_step

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
        check_every_n_steps: int = 10,
    ) -> None:
        """Configure the thresholds.

        Args:
            scale_floor: Warn when the loss scale falls below this value.
            max_skip_rate: Warn when more than this fraction of the last ``window`` steps were skipped.
            window: Number of recent optimizer steps the skip rate is measured over.
            max_consecutive_skips: End the run as diverged after this many skipped steps in a row (0: never).
            check_every_n_steps: Steps between two reads of the counts on the host (1: every step, which
                makes a GPU wait for each step to finish).
        """
        if check_every_n_steps < 1:
            raise ValueError(f"GradScaleWatchdog needs check_every_n_steps >= 1, got {check_every_n_steps}")
        self.scale_floor = scale_floor
        self.max_skip_rate = max_skip_rate
        self.window = window
        self.max_consecutive_skips = max_consecutive_skips
        self.check_every_n_steps = check_every_n_steps
        self.skipped_steps = 0  # read on the host at each check
        self.consecutive_skips = 0
        self._recent: deque[tuple[int, int]] = deque(maxlen=max(1, math.ceil(window / check_every_n_steps)))
        self._scale_before: Tensor | None = None
        self._unread: dict[str, Tensor] = {}  # on the device: skipped, longest run, current run since the last check
        self._unread_steps = 0
        self._warned: set[str] = set()

    @staticmethod
    def _scaler(trainer: L.Trainer):
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        return scaler if scaler is not None and scaler.is_enabled() else None

    @staticmethod
    def _scale_tensor(scaler) -> Tensor | None:
        """The scaler's scale as a device tensor (``get_scale()`` would copy it to the host)."""
        return getattr(scaler, "_scale", None)

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._scaler(trainer) is None:
            rank_zero_info(
                f"GradScaleWatchdog: precision {trainer.precision!r} uses no loss scaler; "
                "only non-finite losses are watched."
            )

    @override
    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        scaler = self._scaler(trainer)
        scale = self._scale_tensor(scaler) if scaler is not None else None
        self._scale_before = scale.clone() if scale is not None else None  # update() changes it in place

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if not isinstance(loss, Tensor):
            return
        skipped = ~torch.isfinite(loss.detach())
        scaler = self._scaler(trainer)
        if scaler is not None:
            if self._scale_before is None:  # accumulating: no optimizer step on this batch
                return
            scale = self._scale_tensor(scaler)
            skipped = skipped | (scale < self._scale_before)
        self._scale_before = None
        self._count(skipped.to(torch.int64))
        # Charts only with a scaler (without one the count is flat zero until the run stops), and only at
        # the logger's steps: a self.log at every step costs more than a small network's step.
        if scaler is not None and at_logging_step(trainer):
            pl_module.log("amp/scale", scale.float(), on_step=True, on_epoch=False)
            total = self._unread["skipped"] + self.skipped_steps
            pl_module.log("amp/skipped_steps", total.float(), on_step=True, on_epoch=False)
        if self._unread_steps >= self.check_every_n_steps:
            self._check(trainer, scaler)

    def _count(self, skipped: Tensor) -> None:
        """Update the device-side counts: no host read."""
        if not self._unread:
            zero = torch.zeros((), dtype=torch.int64, device=skipped.device)
            self._unread = {"skipped": zero, "longest": zero, "run": zero + self.consecutive_skips}
        run = (self._unread["run"] + 1) * skipped
        self._unread = {
            "skipped": self._unread["skipped"] + skipped,
            "longest": torch.maximum(self._unread["longest"], run),
            "run": run,
        }
        self._unread_steps += 1

    def _read(self) -> int:
        """Move the device counts to the host (one read); return the longest run of skips since the last read."""
        if not self._unread:
            return self.consecutive_skips
        skipped, longest, run = torch.stack(list(self._unread.values())).tolist()
        self.skipped_steps += skipped
        self.consecutive_skips = run
        self._recent.append((self._unread_steps, skipped))
        self._unread, self._unread_steps = {}, 0
        return longest

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._read()

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            rank_zero_warn(message)

    def _check(self, trainer: L.Trainer, scaler) -> None:
        longest = self._read()
        scale = scaler.get_scale() if scaler is not None else None
        if scale is not None and scale < self.scale_floor:
            self._warn_once(
                "floor", f"GradScaleWatchdog: the fp16 loss scale fell to {scale:g} (< {self.scale_floor:g}); {CAUSES}."
            )
        steps, skips = (sum(column) for column in zip(*self._recent, strict=True))
        if steps >= self.window and skips > self.max_skip_rate * steps:
            self._warn_once(
                "rate",
                f"GradScaleWatchdog: {skips} of the last {steps} optimizer steps were skipped "
                f"(> {self.max_skip_rate:.0%}); {CAUSES}.",
            )
        if self.max_consecutive_skips and longest >= self.max_consecutive_skips:
            self._stop(trainer)

    def _stop(self, trainer: L.Trainer) -> None:
        self.consecutive_skips = 0
        raise FloatingPointError(
            f"GradScaleWatchdog: {self.max_consecutive_skips} optimizer steps in a row were skipped (non-finite "
            f"gradients or loss) by step {trainer.global_step}; {CAUSES}"
        )

    @override
    def state_dict(self) -> dict[str, Any]:
        self._read()  # a checkpoint holds every skip so far
        return {"skipped_steps": self.skipped_steps}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped_steps = int(state_dict["skipped_steps"])
