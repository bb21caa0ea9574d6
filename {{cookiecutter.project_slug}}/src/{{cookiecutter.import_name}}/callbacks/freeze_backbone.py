"""Train a new classifier head alone on top of pretrained layers, then everything (fine-tuning in two phases)."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from ..models.backbones import head_of


class FreezeBackbone(L.Callback):
    """Freeze every layer of ``model.backbone`` but its head for the first ``unfreeze_at_epoch`` epochs.

    Frozen means no gradient (and so no update and no weight decay); the frozen parameters stay in
    the optimizer, so unfreezing needs no new parameter group and the learning-rate schedule covers
    them from then on. Which layers train follows from the epoch alone, so a resumed run freezes
    exactly what the uninterrupted one did. BatchNorm statistics keep updating. Under DDP, set
    ``trainer.strategy: ddp_find_unused_parameters_true`` (the frozen layers get no gradient).
    """

    def __init__(self, unfreeze_at_epoch: int = 2) -> None:
        """Configure the two phases.

        Args:
            unfreeze_at_epoch: The first epoch (counted from 0) in which the whole network trains.
        """
        if unfreeze_at_epoch < 0:
            raise ValueError(f"FreezeBackbone.unfreeze_at_epoch must be 0 or more, got {unfreeze_at_epoch}")
        self.unfreeze_at_epoch = unfreeze_at_epoch

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        backbone = pl_module.backbone
        head = {id(parameter) for parameter in head_of(backbone).parameters()}
        trains = trainer.current_epoch >= self.unfreeze_at_epoch
        frozen = 0
        for parameter in backbone.parameters():
            if id(parameter) not in head:
                parameter.requires_grad_(trains)
                frozen += 0 if trains else parameter.numel()
        if trainer.current_epoch == self.unfreeze_at_epoch or (frozen and trainer.current_epoch == 0):
            state = "all layers train" if trains else f"{frozen / 1e6:.2f} M parameters frozen, the head trains"
            rank_zero_info(f"FreezeBackbone: epoch {trainer.current_epoch}: {state}")
