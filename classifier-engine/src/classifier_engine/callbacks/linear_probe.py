"""A linear probe first, a fine-tune that keeps what it found, and never a shipped model worse than the probe.

On a few hundred photos the pretrained features already hold most of the answer. A logistic regression
on them (``models/linear_probe.py``) takes seconds, is the baseline a fine-tune must beat, and is the head
the fine-tune starts from (LP-FT). The fine-tune then keeps the pretrained BatchNorm statistics (batches
of a few photos unlike ImageNet re-estimate them badly), and its final validation is compared with the
probe's: whichever scores higher on the validation images is what ``last.ckpt``, the card and the
exports ship. A probe is the same network with a fitted head, so every command treats both alike.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from typing_extensions import override

from ..foundation.errors import UsageError
from ..foundation.plain_values import number_or_nan
from ..models.domain import find_head
from ..models.linear_probe import fit_linear_probe, probe_score
from ..models.network_parts import inference_batch

NORM_LAYERS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
RESUMED_WITHOUT = "the run was resumed from a checkpoint without one"
NO_TRAINING_IMAGES = "the data hands out no training images outside its loaders"
NO_LINEAR_HEAD = "the classifier head is not one linear layer"
SKIP_REASONS = (RESUMED_WITHOUT, NO_TRAINING_IMAGES, NO_LINEAR_HEAD)
Kept = Literal["probe", "fine-tune"]
KEPT: tuple[Kept, ...] = ("probe", "fine-tune")


@dataclass(frozen=True)
class ProbeChoice:
    """What a run's ``LinearProbe`` decided at its final validation, as its checkpoint records it."""

    kept: Kept
    probe_top1: float  # on the validation images (NaN: the probe alone, judged by the run's own validation)
    fine_tune_top1: float  # NaN: the probe alone (fit --recipe probe), no fine-tune to compare

    @property
    def compared(self) -> bool:
        """Whether both were scored on the same validation images."""
        return self.probe_top1 == self.probe_top1 and self.fine_tune_top1 == self.fine_tune_top1

    @classmethod
    def of(cls, checkpoint: dict[str, Any]) -> ProbeChoice | None:
        """The choice a checkpoint records; None where no probe decided. Its values are held to their types."""
        callbacks = checkpoint.get("callbacks")
        state = callbacks.get("LinearProbe") if isinstance(callbacks, dict) else None
        if not isinstance(state, dict) or state.get("kept") not in KEPT:
            return None
        return cls(state["kept"], number_or_nan(state.get("probe_top1")), number_or_nan(state.get("fine_tune_top1")))


def fitting(trainer: L.Trainer) -> bool:
    return trainer.state.fn == "fit" and not trainer.sanity_checking


def final_validation(trainer: L.Trainer) -> bool:
    """Whether this validation of ``fit`` is its last: the weights it judges are the ones the run ends with.

    At ``max_steps``, or at the end of the last of ``max_epochs`` (not a validation inside that epoch).
    """
    last_step = trainer.max_steps is not None and 0 < trainer.max_steps <= trainer.global_step
    epochs = trainer.max_epochs if trainer.max_epochs is not None else -1
    last_epoch = 0 < epochs <= trainer.current_epoch + 1
    return last_step or (last_epoch and trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)


def split_images(datamodule: Any, split: str) -> tuple[Any, np.ndarray] | None:
    """A split's images (uint8, centre-cropped, read when indexed) and labels; None where the data cannot say."""
    if split == "val":
        images = getattr(datamodule, "validation_images", None)
        if not callable(images):
            return None
        held_out = images()
        return held_out.images, np.asarray(held_out.labels)
    training = getattr(datamodule, "train_set", None)
    if training is None or not callable(getattr(training, "view", None)):
        return None
    return training.view(datamodule.image_size)


class LinearProbe(L.Callback):
    """Fit the head as a linear probe on the frozen pretrained features, then fine-tune, and keep the better.

    - Before the first step of a new run: the training images' features (eval mode, each image and its
      mirror) and a logistic regression on them, its L2 strength chosen on held-out folds of the training
      images, folded into the classifier head. Its validation top-1 is printed and logged as
      ``probe/val_top1``: the baseline the fine-tune must beat.
    - During the fine-tune: the norm layers keep their pretrained statistics (``freeze_norm_statistics``).
    - At the final validation: the fine-tuned weights (the weight average, where one is kept) against the
      probe on the validation images, with the model's own test-time views; if the probe is better, the
      network goes back to its starting weights with the probe's head, so the final validation, the
      calibration, ``last.ckpt`` and every export are the probe's. The line says which was kept and by how
      much, and the checkpoint keeps it for the card.
    - ``fine_tune: false`` (``main.py fit --recipe probe``): the probe alone, in an ordinary run of one step
      whose update is dropped: it validates, calibrates, exports, predicts and answers "unknown".

    A resumed run restores the probe's head and figures from the checkpoint, so it ends exactly as the
    uninterrupted run does.
    """

    def __init__(
        self, fine_tune: bool = True, freeze_norm_statistics: bool = True, folds: int = 5, max_images: int = 20_000
    ) -> None:
        """Configure the probe.

        Args:
            fine_tune: Fine-tune after the probe (false: ship the probe alone; ``--recipe probe`` sets it).
            freeze_norm_statistics: Keep the pretrained BatchNorm statistics while fine-tuning (eval-mode norm layers).
            folds: Folds of the training images the probe's L2 strength is chosen on.
            max_images: Training images the probe reads at most (a seeded sample above it).
        """
        if folds < 2 or max_images < 2:
            raise ValueError(f"LinearProbe needs folds >= 2 and max_images >= 2, got {folds} and {max_images}")
        self.fine_tune = fine_tune
        self.freeze_norm_statistics = freeze_norm_statistics
        self.folds = folds
        self.max_images = max_images
        self.head_weight: Tensor | None = None  # the probe's head, once fitted (kept in checkpoints)
        self.head_bias: Tensor | None = None
        self.probe_top1 = float("nan")  # on the validation images, with the model's test-time views
        self.fine_tune_top1 = float("nan")  # the fine-tune's, at the final validation
        self.kept = ""  # "probe" or "fine-tune", once the final validation decided
        self.skipped = ""  # why no probe was fitted, if none was
        self._start: dict[str, Tensor] | None = None  # the backbone's weights before the first step
        self.pretrained = False

    @property
    def fitted(self) -> bool:
        return self.head_weight is not None

    def describe_choices(self, trainer: L.Trainer) -> list[str]:
        """The recipe's parts this callback chose, in words (for the fine-tune's plan line)."""
        if not self.pretrained:
            return []
        if self.skipped:
            return [f"no linear probe ({self.skipped})"]
        if not self.fine_tune:
            return ["the linear probe alone (the head fitted on the frozen features; no fine-tune)"]
        norms = (
            "BatchNorm statistics kept as pretrained (batches of a few photos would re-estimate them badly)"
            if self.freeze_norm_statistics
            else "BatchNorm statistics re-estimated"
        )
        return ["the head first fitted as a linear probe (LP-FT)", norms, "the better of probe and fine-tune kept"]

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # Before a checkpoint is restored: the weights the network was built with (pretrained, new head).
        # The networks that start from pretrained weights say so (models/starting_weights.py), as FreezeBackbone reads.
        self.pretrained = bool(getattr(pl_module.backbone, "pretrained", False))
        if stage == "fit" and self.pretrained:
            weights = pl_module.backbone.state_dict()
            self._start = {name: value.detach().cpu().clone() for name, value in weights.items()}

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.pretrained:  # nothing to keep: random weights have no features worth a probe
            self.head_weight = self.head_bias = None
            self.skipped = ""
        elif self.fitted:  # a resumed run: its probe came with the checkpoint
            head = self._head(pl_module)
            if head.weight.shape != self.head_weight.shape:
                raise ValueError(
                    f"the checkpoint's LinearProbe head is {tuple(self.head_weight.shape)}, the network's "
                    f"{tuple(head.weight.shape)}"
                )
            if not trainer.fit_loop.done:  # an extended run decides again at its new end
                self.kept, self.fine_tune_top1 = "", float("nan")
        elif not self.skipped:
            self.skipped = RESUMED_WITHOUT if trainer.global_step > 0 else self._fit_probe(trainer, pl_module)
            if self.skipped:
                rank_zero_info(f"LinearProbe: no probe: {self.skipped}")
        if not self.fine_tune and not self.fitted:
            why = self.skipped or "the network starts from random weights"
            raise UsageError(f"--recipe probe: no linear probe could be fitted ({why}); leave --recipe out")
        if not self.fine_tune:  # the probe alone is kept by construction, with validation images or none
            self.kept = "probe"

    @staticmethod
    def _head(pl_module: Any) -> nn.Module:
        """The classifier head, found by a forward pass in eval mode: no BatchNorm statistics move, no dropout draws
        (a resumed run must leave the weights and the random streams as the uninterrupted run has them)."""
        size = pl_module.image_size
        was_training = pl_module.training
        pl_module.eval()
        try:
            return find_head(pl_module, torch.zeros(2, 3, size, size, dtype=torch.uint8, device=pl_module.device))
        finally:
            pl_module.train(was_training)

    def _fit_probe(self, trainer: L.Trainer, pl_module: Any) -> str:
        """Fit the probe into the head; an empty string, or why it could not be."""
        started = time.perf_counter()
        training, validation = split_images(trainer.datamodule, "train"), split_images(trainer.datamodule, "val")
        if training is None:
            return NO_TRAINING_IMAGES
        images, labels = training
        rows = np.arange(len(labels))
        if len(rows) > self.max_images:
            rows = np.sort(np.random.default_rng(0).choice(len(rows), self.max_images, replace=False))
        was_training = pl_module.training
        pl_module.eval()  # the features as evaluated: no dropout, the pretrained BatchNorm statistics
        try:
            try:
                head = find_head(pl_module, torch.from_numpy(np.array(images[0:2])).to(pl_module.device))
            except ValueError:
                head = None
            classes = len(pl_module.class_names)
            if not isinstance(head, nn.Linear) or head.out_features != classes:
                return NO_LINEAR_HEAD
            fit, probe_top1 = None, float("nan")
            if trainer.is_global_zero:  # the other ranks take rank 0's head and figure: one decision everywhere
                features = self._features(pl_module, images, rows)
                groups = torch.as_tensor(np.concatenate([rows, rows]))
                targets = torch.as_tensor(np.concatenate([labels[rows], labels[rows]]))
                fit = fit_linear_probe(features, targets, groups, classes, pl_module.multilabel, self.folds)
            fit = trainer.strategy.broadcast(fit, src=0)
            with torch.no_grad():
                head.weight.copy_(fit.weight.to(head.weight))
                head.bias.copy_(fit.bias.to(head.bias))
            self.head_weight, self.head_bias = fit.weight.clone(), fit.bias.clone()
            judged = self.fine_tune and validation is not None and len(validation[1])  # alone: its validation says
            if trainer.is_global_zero and judged:
                probe_top1 = self.score(pl_module, *validation)
            self.probe_top1 = trainer.strategy.broadcast(probe_top1, src=0)
        finally:
            pl_module.train(was_training)
        seconds = time.perf_counter() - started
        how = (
            f"Linear probe on {len(rows):,} training images and their mirrors (L2 {fit.l2:.0e}, chosen on "
            f"{self.folds} folds of them: {fit.folds_score:.3f}) in {seconds:.0f} s"
        )
        if not self.fine_tune:
            rank_zero_info(f"{how}: the probe alone, judged by the validation that follows")
            return ""
        if self.probe_top1 != self.probe_top1:  # NaN: no validation images to judge it on
            rank_zero_info(f"{how}; no validation images: the fine-tune is kept without a comparison")
            return ""
        if trainer.logger is not None:
            trainer.logger.log_metrics({"probe/val_top1": self.probe_top1}, step=0)
        rank_zero_info(f"{how}: validation top-1 {self.probe_top1:.3f}, the figure the fine-tune must beat")
        return ""

    @staticmethod
    def _features(pl_module: Any, images: Any, rows: np.ndarray) -> Tensor:
        """Each row's features, then each mirror's: the frozen network's penultimate features, in eval mode."""
        plain, mirrored = [], []
        batch_size = inference_batch(pl_module.device)
        with torch.no_grad():
            for start in range(0, len(rows), batch_size):
                chunk = torch.from_numpy(np.array(images[rows[start : start + batch_size]]))
                chunk = chunk.to(pl_module.device)
                plain.append(pl_module.features(chunk).float().cpu())
                mirrored.append(pl_module.features(chunk.flip(-1)).float().cpu())
        return torch.cat(plain + mirrored)

    @staticmethod
    def score(pl_module: Any, images: Any, labels: np.ndarray) -> float:
        """The model's validation figure as its final validation computes the logits (every test-time view)."""
        logits = []
        batch_size = inference_batch(pl_module.device)
        with torch.no_grad():
            for start in range(0, len(labels), batch_size):
                chunk = torch.from_numpy(np.array(images[start : start + batch_size]))  # a writable copy
                logits.append(pl_module.evaluate(chunk.to(pl_module.device), True).float().cpu())
        return probe_score(torch.cat(logits), torch.from_numpy(np.array(labels)), pl_module.multilabel)

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        # Lightning puts the whole module in train mode at each epoch's start and after each validation.
        if self.fitted and (self.freeze_norm_statistics or not self.fine_tune):
            for module in pl_module.backbone.modules():
                if isinstance(module, NORM_LAYERS):
                    module.eval()

    @override
    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if self.fitted and not self.fine_tune:  # the probe alone: the step's update (and weight decay) is dropped
            for parameter in pl_module.parameters():
                parameter.grad = None

    @override
    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        # At the first batch, not the epoch's start: a weight average is swapped in by then, whatever the
        # callbacks' order, and what this validation computes (figures, calibration) is of the weights kept.
        if batch_idx or dataloader_idx or not fitting(trainer) or not final_validation(trainer) or not self.fitted:
            return
        if not self.fine_tune:  # the probe alone: exactly the probe, whatever a weight average made of the step
            self._restore_probe(pl_module)
            return
        if self.kept:
            return
        validation = split_images(trainer.datamodule, "val")
        if validation is None or self.probe_top1 != self.probe_top1:  # nothing to compare on
            return
        score = self.score(pl_module, *validation) if trainer.is_global_zero else float("nan")
        self.fine_tune_top1 = trainer.strategy.broadcast(score, src=0)  # one decision on every rank
        probe_better = self.fine_tune_top1 < self.probe_top1
        self.kept = "probe" if probe_better else "fine-tune"
        if probe_better:
            self._restore_probe(pl_module)
        other = "fine-tune" if probe_better else "probe"
        kept_top1, other_top1 = sorted((self.probe_top1, self.fine_tune_top1), reverse=True)
        rank_zero_info(
            f"LinearProbe: kept the {self.kept}: validation top-1 {kept_top1:.3f} against the {other}'s "
            f"{other_top1:.3f} (+{100 * (kept_top1 - other_top1):.1f} points)"
        )

    def _restore_probe(self, pl_module: Any) -> None:
        """The network's starting weights with the probe's head, in place (an average swapped in takes them)."""
        if self._start is None or self.head_weight is None or self.head_bias is None:
            raise RuntimeError("LinearProbe: the starting weights were not kept (setup did not run for fit)")
        head = self._head(pl_module)
        if head.weight.shape != self.head_weight.shape:
            raise ValueError(
                f"the checkpoint's LinearProbe head is {tuple(self.head_weight.shape)}, the network's "
                f"{tuple(head.weight.shape)}"
            )
        with torch.no_grad():
            for name, value in pl_module.backbone.state_dict().items():
                value.copy_(self._start[name].to(value))
            head.weight.copy_(self.head_weight.to(head.weight))
            head.bias.copy_(self.head_bias.to(head.bias))

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.fitted and self.fine_tune and not self.kept and self.probe_top1 == self.probe_top1:
            rank_zero_info(
                "LinearProbe: the run ended before its final validation (early stopping, max_time, a validation "
                "interval that skips the last epoch): the fine-tune is kept without a comparison with the probe"
            )

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "head_weight": self.head_weight,
            "head_bias": self.head_bias,
            "probe_top1": self.probe_top1,
            "fine_tune_top1": self.fine_tune_top1,
            "kept": self.kept,
            "skipped": self.skipped,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # A checkpoint is data: each value is held to its type here, the head's shape when training starts.
        state_dict = state_dict if isinstance(state_dict, dict) else {}
        weight, bias = state_dict.get("head_weight"), state_dict.get("head_bias")
        tensors = isinstance(weight, Tensor) and isinstance(bias, Tensor)
        if tensors and not (weight.is_floating_point() and weight.dim() == 2 and bias.shape == weight.shape[:1]):
            raise ValueError("the checkpoint's LinearProbe head is not a weight matrix and a bias of its rows")
        self.head_weight, self.head_bias = (weight, bias) if tensors else (None, None)
        self.probe_top1 = number_or_nan(state_dict.get("probe_top1"))
        self.fine_tune_top1 = number_or_nan(state_dict.get("fine_tune_top1"))
        self.kept = state_dict.get("kept") if state_dict.get("kept") in KEPT else ""
        self.skipped = state_dict.get("skipped") if state_dict.get("skipped") in SKIP_REASONS else ""
