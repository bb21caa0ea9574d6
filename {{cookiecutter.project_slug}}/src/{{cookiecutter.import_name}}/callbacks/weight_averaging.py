"""Evaluate and ship an exponential moving average of the weights, with a decay that suits short runs too."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import WeightAveraging
from torch import Tensor
from torch.optim.swa_utils import get_ema_multi_avg_fn
from typing_extensions import override


class EMAWeights(WeightAveraging):
    """Lightning's weight averaging as an exponential moving average that warms up.

    Lightning's ``EMAWeightAveraging`` keeps one decay from the first step: at 0.999 its average spans
    about a thousand steps, and a fine-tune of a few hundred photos (tens of steps) would ship weights
    close to where it started. With the warm-up (timm's ``ModelEmaV3`` rule) the average spans about a
    tenth of the steps so far, up to ``decay``: right for ten steps and for a million.

    Lightning does the rest: validation runs on the averaged weights, checkpoints hold them as the model's
    ``state_dict`` (so ``test``, ``predict``, ``export.py`` and the model card use them) and keep the
    training weights beside them (``current_model_state``), so ``--ckpt_path last`` resumes both exactly.
    Buffers (BatchNorm statistics) are averaged too.
    """

    def __init__(self, decay: float = 0.9998, warmup: bool = True, update_every_n_steps: int = 1) -> None:
        """Configure the average.

        Args:
            decay: The largest share of the average kept at each update (0.9998: a window of ~5,000 updates).
            warmup: Start with a window of about a tenth of the updates so far, growing to the decay's.
            update_every_n_steps: Optimizer steps between updates of the average.
        """
        if not 0 < decay < 1 or update_every_n_steps < 1:
            raise ValueError(
                f"EMAWeights needs 0 < decay < 1 and update_every_n_steps >= 1, got {decay} and {update_every_n_steps}"
            )
        super().__init__(use_buffers=True, multi_avg_fn=self._blend)
        self.decay = decay
        self.warmup = warmup
        self.update_every_n_steps = update_every_n_steps
        self._decay_now = decay

    @override
    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        if step_idx is None or (step_idx + 1) % self.update_every_n_steps:
            return False
        # The decay follows from the step alone (no device read, and a resumed run blends as the first did).
        earlier = (step_idx + 1) // self.update_every_n_steps - 1
        self._decay_now = min(self.decay, (1 + earlier) / (10 + earlier)) if self.warmup else self.decay
        return True

    def describe_choices(self, trainer: L.Trainer) -> list[str]:
        """The average's span at the end of this run's steps, in words (for the fine-tune's plan line)."""
        updates = int(trainer.estimated_stepping_batches) // self.update_every_n_steps
        decay = min(self.decay, updates / (9 + updates)) if self.warmup else self.decay
        span = max(1, round(1 / (1 - decay)))
        steps = span * self.update_every_n_steps
        return [f"the weights averaged over about the last {steps:,} of {updates * self.update_every_n_steps:,} steps"]

    def _blend(self, averages: list[Tensor], currents: list[Tensor], updates: Tensor) -> None:
        get_ema_multi_avg_fn(self._decay_now)(averages, currents, updates)

    @override
    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        # Outside fit the checkpoint's state_dict (the average) is already the model: nothing to restore, and no
        # warning to show on every test and predict.
        if trainer.state.fn == "fit":
            super().on_load_checkpoint(trainer, pl_module, checkpoint)
