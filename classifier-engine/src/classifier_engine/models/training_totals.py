"""The training loss and accuracy of an epoch, summed on the device at every step and read once at its end."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.strategies import Strategy
from torch import Tensor


class TrainingTotals:
    """Running sums behind ``train/loss_epoch``, ``train/top1`` and ``train/top5``.

    A torchmetrics update and a ``self.log`` at every step cost more than a small network's whole
    step (``classifier_engine.bench step --overhead``); these are a top-k and one in-place addition on
    the device, never read on the host before the epoch ends. Their state goes into checkpoints
    (summed over ranks), so an epoch resumed in its middle still averages over all its batches.
    The sums are float64 (float32 on Apple's MPS, which lacks it), so the order in which ranks' and
    resumed epochs' parts are added does not show in the logged float32 averages.
    """

    def __init__(self, num_classes: int) -> None:
        self.top_k = min(5, num_classes)
        self.sums: Tensor | None = None  # (loss x images, top-1 hits, top-k hits), on the training device
        self.images = 0
        self.batches = 0
        self.scored = True  # every batch came with logits: the accuracies mean something

    def add(self, loss: Tensor, logits: Tensor | None, labels: Tensor) -> None:
        """Count one batch (``loss`` is its mean; ``labels``: class indices, or multi-label 0/1 rows).

        Without ``logits`` (a training step that returns its loss alone) only the loss is counted.
        """
        if logits is None:
            self.scored = False
            hits = torch.zeros(labels.shape[0], 1, dtype=torch.bool, device=loss.device)
        else:
            top = logits.detach().topk(self.top_k, dim=1).indices
            # Multi-label rows (N, classes): a hit is a predicted class the image has.
            hits = labels.gather(1, top) >= 0.5 if labels.dim() == 2 else top == labels.unsqueeze(1)
        batch = torch.stack(
            (loss.detach().to(_sum_dtype(loss.device)) * labels.shape[0], hits[:, 0].sum(), hits.any(dim=1).sum())
        )
        self.sums = batch if self.sums is None else self.sums.add_(batch)
        self.images += labels.shape[0]
        self.batches += 1

    def means(self, strategy: Strategy) -> dict[str, Tensor]:
        """The epoch's averages over every rank's images (one collective under DDP); empty before any batch."""
        if not self.batches:  # the same on every rank
            return {}
        loss, top1, top_k, images = self._packed(strategy)
        if not self.scored:
            return {"train/loss_epoch": loss / images}
        return {"train/loss_epoch": loss / images, "train/top1": top1 / images, "train/top5": top_k / images}

    def reset(self) -> None:
        self.sums, self.images, self.batches = None, 0, 0

    def state_dict(self, strategy: Strategy, epoch: int) -> dict[str, Any]:
        """What a checkpoint keeps: every rank's sums added up, and the epoch and batch they stand at."""
        return {"epoch": epoch, "batches": self.batches, "sums": self._packed(strategy).cpu()}

    def load_state_dict(self, state: dict[str, Any], device: torch.device, keep_sums: bool) -> None:
        """Continue from a checkpoint's sums (``keep_sums`` on one rank only: the others start from zero)."""
        sums = state["sums"] if keep_sums else torch.zeros(4)
        self.sums = sums[:3].to(device=device, dtype=_sum_dtype(device))
        self.images, self.batches = int(sums[3]), int(state["batches"])

    def _packed(self, strategy: Strategy) -> Tensor:
        """(loss x images, top-1 hits, top-k hits, images), summed over ranks."""
        device = strategy.root_device
        sums = self.sums if self.sums is not None else torch.zeros(3, dtype=_sum_dtype(device), device=device)
        packed = torch.cat((sums, sums.new_tensor([self.images])))
        return strategy.reduce(packed, reduce_op="sum") if strategy.world_size > 1 else packed


def _sum_dtype(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "mps" else torch.float64
