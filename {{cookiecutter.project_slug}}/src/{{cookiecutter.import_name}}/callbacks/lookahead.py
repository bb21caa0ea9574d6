"""Lookahead as airbench94 uses it: the weights are pulled back to a slow average every few steps."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from typing_extensions import override


class Lookahead(L.Callback):
    """Every ``every_n_steps`` steps, move a slow copy of the weights toward the weights, then reset the weights to it.

    The pull is ``1 - decay**every_n_steps * (step / total_steps)**power``: early in training the slow copy
    simply follows the weights, late in training it averages them. When the last step is reached the
    weights become the slow copy, so the final checkpoint holds the averaged model. Floating-point
    buffers (BatchNorm statistics) are averaged too.
    """

    def __init__(self, every_n_steps: int = 5, decay: float = 0.95, power: float = 3.0) -> None:
        """Configure the averaging.

        Args:
            every_n_steps: Optimizer steps between two pulls.
            decay: Per-step decay of the slow copy at the end of training.
            power: How late the averaging sets in: the decay grows as (step / total steps) ** power.
        """
        if every_n_steps < 1 or not 0.0 <= decay <= 1.0:
            raise ValueError(f"Lookahead needs every_n_steps >= 1 and 0 <= decay <= 1, got {every_n_steps} and {decay}")
        self.every_n_steps = every_n_steps
        self.decay = decay
        self.power = power
        self.slow: dict[str, Tensor] | None = None
        self._total_steps = 1
        self._pairs: tuple[list[Tensor], list[Tensor]] = ([], [])

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        weights = self._averaged(pl_module)
        if self.slow is None:
            self.slow = {name: tensor.detach().clone() for name, tensor in weights.items()}
        else:  # restored from a checkpoint, on the CPU
            self.slow = {name: self.slow[name].to(tensor.device) for name, tensor in weights.items()}
        # Looked up once: the steps of this fit, and the tensors both sides of a pull (same order).
        self._total_steps = trainer.estimated_stepping_batches
        self._pairs = ([self.slow[name] for name in weights], list(weights.values()))

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step, total = trainer.global_step, self._total_steps
        if step % self.every_n_steps == 0:
            self.pull(self.decay**self.every_n_steps * min(step / total, 1.0) ** self.power)
        if step >= total:
            self.pull(1.0)  # the weights become the slow copy

    @torch.no_grad()
    def pull(self, decay: float) -> None:
        """Slow copy <- lerp(slow copy, weights, 1 - decay); weights <- slow copy (two fused kernels per dtype)."""
        slow, weights = self._pairs
        # torch's multi-tensor kernels, which its own optimizers use; no public spelling exists (test_private_routes).
        torch._foreach_lerp_(slow, weights, 1.0 - decay)
        torch._foreach_copy_(weights, slow)

    @staticmethod
    def _averaged(module: nn.Module) -> dict[str, Tensor]:
        return {name: tensor for name, tensor in module.state_dict().items() if tensor.is_floating_point()}

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"slow": self.slow}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.slow = state_dict["slow"]
