"""Train a new head alone on top of pretrained layers, then everything; and say how the fine-tune fits the folder."""

from __future__ import annotations

import math

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from classifier_engine import counted, head_epochs_for

from ..models.backbones import head_of


class FreezeBackbone(L.Callback):
    """Freeze every layer of ``model.backbone`` but its head for the first ``unfreeze_at_epoch`` epochs.

    Frozen means no gradient (and so no update and no weight decay); the frozen parameters stay in
    the optimizer, so unfreezing needs no new parameter group and the learning-rate schedule covers
    them from then on. Which layers train follows from the epoch alone, so a resumed run freezes
    exactly what the uninterrupted one did. BatchNorm statistics keep updating. Under DDP the frozen
    layers' gradients are computed and dropped instead, so the strategy needs no unused-parameter search.

    At the start of training it prints the fine-tune's plan in one line: the images, the epochs and
    steps, the batch and mixing the data chose, this phase, and the weight average's span, each
    marked "(as set)" where the config gave it rather than the folder's size.
    """

    def __init__(self, unfreeze_at_epoch: int | None = None) -> None:
        """Configure the two phases.

        Args:
            unfreeze_at_epoch: The first epoch (counted from 0) in which the whole network trains; null: from the
                number of training images (1 below 100,000, else 0: ``classifier_engine.head_epochs_for``), 0 for a
                backbone that starts from random weights (nothing to keep).
        """
        if unfreeze_at_epoch is not None and unfreeze_at_epoch < 0:
            raise ValueError(f"FreezeBackbone.unfreeze_at_epoch must be 0 or more, got {unfreeze_at_epoch}")
        self.unfreeze_at_epoch = unfreeze_at_epoch
        self.head_epochs = unfreeze_at_epoch or 0
        self.pretrained = False
        self._frozen: list[torch.nn.Parameter] = []  # the body's parameters while the head trains alone

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # After the data module's setup: its training split is known (a resumed run counts the same images).
        training = getattr(trainer.datamodule, "train_set", None)
        self.pretrained = bool(getattr(pl_module.backbone, "pretrained", False))
        if self.unfreeze_at_epoch is None and training is not None:
            self.head_epochs = head_epochs_for(len(training)) if self.pretrained else 0

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        rank_zero_info(self.plan(trainer))

    def plan(self, trainer: L.Trainer) -> str:
        """The fine-tune in one line, e.g. "Fine-tuning 245 training images: 5 epochs of 15 steps, batch 16, ..."."""
        datamodule = trainer.datamodule
        training = getattr(datamodule, "train_set", None)
        images = f"{len(training):,} training images" if training is not None else "the training images"
        steps = trainer.num_training_batches // max(1, trainer.accumulate_grad_batches)
        if trainer.max_steps is not None and trainer.max_steps > 0:
            epochs = math.ceil(trainer.max_steps / max(1, steps))
            budget = f"{counted(trainer.max_steps, 'step')} ({counted(epochs, 'epoch')} of {steps})"
        else:
            budget = f"{counted(trainer.max_epochs, 'epoch')} of {counted(steps, 'step')}"
        words = [budget, *getattr(datamodule, "describe_choices", list)()]
        phase = f"head alone for {counted(self.head_epochs, 'epoch')}" if self.head_epochs else "all layers at once"
        words.append(f"{phase} (as set)" if self.unfreeze_at_epoch is not None else phase)
        for callback in trainer.callbacks:
            describe = getattr(callback, "describe_choices", None)
            if callback is not self and callable(describe):
                words.extend(describe(trainer))
        start = f"Fine-tuning {images}" if self.pretrained else f"Training {images} from scratch"
        return f"{start}: {', '.join(words)}"

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        backbone = pl_module.backbone
        head = {id(parameter) for parameter in head_of(backbone).parameters()}
        trains = trainer.current_epoch >= self.head_epochs
        body = [parameter for parameter in backbone.parameters() if id(parameter) not in head]
        # Under DDP every parameter keeps its gradient (the reducer expects one from each, and a parameter it
        # was built without would never be synchronized later); the frozen ones' are dropped before the step.
        distributed = trainer.world_size > 1
        for parameter in body:
            parameter.requires_grad_(trains or distributed)
        self._frozen = [] if trains else body
        if self.head_epochs and trainer.current_epoch in (0, self.head_epochs):
            frozen = sum(parameter.numel() for parameter in self._frozen)
            state = "all layers train" if trains else f"{frozen / 1e6:.2f} M parameters frozen, the head trains"
            rank_zero_info(f"FreezeBackbone: epoch {trainer.current_epoch}: {state}")

    @override
    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        # A parameter without a gradient is skipped by the optimizer: no update, no weight decay, no momentum.
        for parameter in self._frozen:
            parameter.grad = None
