"""Per-layer histograms of weights and gradients, and gradient norms, every N optimizer steps.

Gradients are read in ``on_before_optimizer_step``: under fp16 AMP the scaler has unscaled them
by then (in ``on_after_backward`` they are still multiplied by the loss scale), and with gradient
accumulation it fires once per step, with the accumulated gradients. Non-finite values (a step
the scaler will skip) are counted and left out of the histogram: TensorBoard refuses to draw an
all-inf histogram, and a logging callback must never end a run.
"""

from __future__ import annotations

import lightning as L
import torch
from torch import Tensor
from typing_extensions import override

from classifier_engine import tensorboard_writers


class GradientHistograms(L.Callback):
    """Log weight and gradient histograms (``weights/``, ``weights_grad/``), gradient norms and non-finite counts.

    The tags start with ``weights`` so that TensorBoard lists these diagnostics after ``train/`` and ``val/``.
    """

    def __init__(
        self, every_n_steps: int = 200, log_weights: bool = True, log_norms: bool = True, bins: int = 64
    ) -> None:
        """Configure the cadence.

        Args:
            every_n_steps: Log every this many optimizer steps (and at step 0); 0 turns the callback off.
            log_weights: Also log histograms of the weights themselves.
            log_norms: Log the global and per-layer gradient L2 norms as scalars (works with any logger).
            bins: Number of histogram bins.
        """
        if every_n_steps < 0:
            raise ValueError(f"every_n_steps must be 0 (off) or positive, got {every_n_steps}")
        if bins < 1:
            raise ValueError(f"bins must be positive, got {bins}")
        self.bins = bins
        self.every_n_steps = every_n_steps
        self.log_weights = log_weights
        self.log_norms = log_norms

    @override
    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        if not self.every_n_steps or trainer.global_step % self.every_n_steps or not trainer.is_global_zero:
            return
        step = trainer.global_step
        writers = tensorboard_writers(trainer, self, "weight and gradient histograms")
        scalars: dict[str, float] = {}
        squared_norms = []
        nonfinite_total = 0
        for name, parameter in pl_module.named_parameters():
            if self.log_weights:
                self._histogram(writers, f"weights/{name}", parameter, step)
            if parameter.grad is None:
                continue
            grad = parameter.grad.detach().float()
            finite = torch.isfinite(grad)
            nonfinite = int((~finite).sum())
            nonfinite_total += nonfinite
            if nonfinite:
                scalars[f"weights_grad_nonfinite/{name}"] = float(nonfinite)
            finite_grad = grad[finite]
            if self.log_norms:
                norm = torch.linalg.vector_norm(finite_grad)
                squared_norms.append(norm.square())
                scalars[f"weights_grad_norm/{name}"] = float(norm)
            self._histogram(writers, f"weights_grad/{name}", finite_grad, step)
        if self.log_norms and squared_norms:
            scalars["weights_grad_norm/total"] = float(torch.stack(squared_norms).sum().sqrt())
        scalars["weights_grad_nonfinite/total"] = float(nonfinite_total)
        for logger in trainer.loggers:
            logger.log_metrics(scalars, step=step)

    def _histogram(self, writers: list, tag: str, values: Tensor, step: int) -> None:
        """Bin on the tensor's own device and send only the bins: copying millions of values to
        the host for TensorBoard to bin with numpy costs ~100x more."""
        values = values.detach().float().flatten()
        values = values[torch.isfinite(values)]
        if values.numel() == 0 or not writers:
            return
        low, high = values.min(), values.max()
        counts = torch.histc(values, bins=self.bins, min=float(low), max=float(high))
        edges = torch.linspace(float(low), float(high), self.bins + 1, device=values.device)[1:]
        summary = torch.stack([low, high, values.sum(), values.square().sum()]).tolist()
        for writer in writers:
            writer.add_histogram_raw(
                tag,
                min=summary[0],
                max=summary[1],
                num=values.numel(),
                sum=summary[2],
                sum_squares=summary[3],
                bucket_limits=edges.tolist(),
                bucket_counts=counts.tolist(),
                global_step=step,
            )
