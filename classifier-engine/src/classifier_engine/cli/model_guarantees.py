"""What a trained model's promises rest on, kept by callbacks the CLI installs whatever the config or the model says.

A project's LightningModule is the user's to rewrite (its ``training_step``, its validation hooks),
so what exact resume and calibrated answers need does not live there:

- ``CalibrationFit``: after each validation of ``fit``, the calibration (temperature, thresholds, the bank of
  training features and both "unknown" thresholds) is fitted on the validation images, before that
  validation's checkpoints; every checkpoint keeps it and every restore takes it back;
- ``TrainingTotalsLog``: ``train/loss_epoch``, ``train/top1``, ``train/top5`` summed on the device and kept
  in checkpoints, so an epoch resumed in its middle averages over all its batches;
- ``FinalValidation``: a run that reaches ``max_steps`` inside an epoch validates its final weights;
- ``ScheduleResume``: the learning-rate schedule stands at the restored step, even where the checkpoint
  lacks the schedule's state.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import WeightAveraging
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor
from typing_extensions import override

from ..contract import ResumableSchedule
from ..data.interfaces import EvaluationData
from ..foundation.logging_steps import at_logging_step
from ..models.domain import BANK_SEED, bank_capacity, find_head
from ..models.network_parts import inference_batch
from ..models.training_totals import TrainingTotals

TOTALS_KEY = "training_totals"
AVERAGED_BY_KEY = "averaged_by"  # the class name of the callback whose weight average the state_dict holds


def fitting(trainer: L.Trainer) -> bool:
    return trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking


class CalibrationFit(L.Callback):
    """Fit ``pl_module.calibration`` on each validation of ``fit``; keep it in checkpoints and restore it.

    The logits are what ``validation_step`` returns when it returns them (the project's model does);
    otherwise they are computed again with ``pl_module.evaluate``. The features of the validation images are
    the classifier head's input in that same forward pass (watched by a hook, so validation costs no second
    pass); where the head cannot be found or the step did not call it once, the contract's ``features()``
    computes them. A seeded sample of the training images (``domain.BANK_IMAGES`` at most, the bank's bytes
    bounded) costs one forward pass without gradients per validation.
    """

    def __init__(self) -> None:
        self.training_features: Tensor | None = None
        self.hook: torch.utils.hooks.RemovableHandle | None = None
        self.head_tried = False  # once per fit: a network whose features() no module receives is not hooked
        self.seen: list[Tensor] = []
        self.watching = False

    @override
    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        pl_module.calibration.reset()
        self.training_features = None

    @override
    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if not fitting(trainer):
            return
        if self.training_features is None:
            # Here, not at the epoch's end: the weights validated are the ones checkpointed (a weight average is
            # swapped in for validation at its start, and back out at its end).
            self.training_features = training_features(trainer, pl_module)
        if not self.head_tried:
            self.head_tried = True
            self.watch_head(pl_module, batch[0][:2])
        self.seen, self.watching = [], True

    def watch_head(self, pl_module: Any, images: Tensor) -> None:
        """Hook the module whose input ``features()`` returns (the classifier head), if there is one."""
        try:
            head = find_head(pl_module, images)
        except ValueError:
            return
        self.hook = head.register_forward_pre_hook(self._seen_by_head)

    def _seen_by_head(self, _module: torch.nn.Module, args: tuple) -> None:
        if self.watching and args and isinstance(args[0], Tensor):
            self.seen.append(args[0].detach().flatten(1))

    @override
    def on_validation_batch_end(
        self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if not fitting(trainer):
            return
        images, labels = batch[0], batch[1]
        logits = outputs
        with torch.no_grad():
            if not (isinstance(logits, Tensor) and logits.shape == (len(labels), len(pl_module.class_names))):
                self.seen = []
                logits = pl_module.evaluate(images)
            seen, self.seen, self.watching = self.seen, [], False
            single_pass = len(seen) == 1 and seen[0].shape[0] == len(labels)
            features = seen[0].float() if single_pass else pl_module.features(images)
        pl_module.calibration.collect(logits.detach(), labels, features)

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        self.stop_watching()

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: Any, exception: BaseException) -> None:
        self.stop_watching()

    def stop_watching(self) -> None:
        if self.hook is not None:
            self.hook.remove()
        self.hook, self.head_tried, self.seen, self.watching = None, False, [], False

    @override
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        # Fitted on this validation's images (every rank's: the same numbers on each), before the checkpoints
        # of this validation are written.
        if fitting(trainer):
            figures = {
                f"val/{name}": value for name, value in pl_module.calibration.fit(self.training_features).items()
            }
            self.training_features = None
            pl_module.log_dict(figures, sync_dist=True)

    @override
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        pl_module.calibration.save_to(checkpoint)
        # Which callback keeps a weight average, for the card: one that says so by being Lightning's WeightAveraging.
        averagers = [type(callback).__name__ for callback in trainer.callbacks if isinstance(callback, WeightAveraging)]
        if averagers:
            checkpoint[AVERAGED_BY_KEY] = averagers[0]

    @override
    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        pl_module.calibration.restore_from(checkpoint)  # a no-op where the model's own hook has taken it
        # Once per restore, not per dict: a later command may hand the same cached dict to a since-trained model.
        pl_module.calibration.taken = None


def training_features(trainer: L.Trainer, pl_module: Any) -> Tensor | None:
    """The features of a seeded sample of the training images, as many as the bank keeps (None: the data
    cannot hand out training images, as a DataModule of the user's own may not)."""
    data = trainer.datamodule
    if not isinstance(data, EvaluationData):
        return None
    probe = torch.as_tensor(data.training_sample(1, seed=BANK_SEED)).to(pl_module.device)
    with torch.no_grad():
        dimension = pl_module.features(probe).shape[1]
        images = data.training_sample(bank_capacity(dimension), seed=BANK_SEED)
        batch_size = inference_batch(pl_module.device)
        chunks = [
            pl_module.features(torch.as_tensor(images[start : start + batch_size]).to(pl_module.device))
            for start in range(0, len(images), batch_size)
        ]
    return torch.cat(chunks).float() if chunks else None


class TrainingTotalsLog(L.Callback):
    """The training loss and accuracy of each epoch, from what ``training_step`` returns.

    ``training_step`` returning ``{"loss": ..., "logits": ...}`` gives ``train/top1`` and ``train/top5``
    as well as ``train/loss_epoch``; a bare loss gives the loss alone. ``train/loss_step`` is logged at
    the logger's cadence (a log call at every step costs more than a small network's step).
    """

    def __init__(self) -> None:
        self.totals: TrainingTotals | None = None
        self.restored: dict[str, Any] | None = None

    @override
    def setup(self, trainer: L.Trainer, pl_module: Any, stage: str) -> None:
        self.totals = TrainingTotals(len(pl_module.class_names))

    @override
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        # The first batch after a mid-epoch resume continues the checkpoint's sums of that epoch.
        restored, self.restored = self.restored, None
        if restored is not None and (restored["epoch"], restored["batches"]) == (trainer.current_epoch, batch_idx):
            self.totals.load_state_dict(restored, trainer.strategy.root_device, keep_sums=trainer.is_global_zero)

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is None:  # a step the model skipped
            return
        logits = outputs.get("logits") if isinstance(outputs, dict) else None
        labels = batch[1]
        # Mixed images count as their larger share's class, so train/top1 still compares with val/top1
        # (multi-label: train/top1 is the share of images whose most probable label is one of theirs).
        if labels.dim() == 2 and not pl_module.multilabel:
            labels = labels.argmax(dim=1)
        self.totals.add(loss, logits, labels)
        if at_logging_step(trainer):
            pl_module.log("train/loss_step", loss, on_step=True, on_epoch=False)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        pl_module.log_dict(self.totals.means(trainer.strategy), on_epoch=True)
        self.totals.reset()

    @override
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        if self.totals is not None:
            checkpoint[TOTALS_KEY] = self.totals.state_dict(trainer.strategy, trainer.current_epoch)

    @override
    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        self.restored = checkpoint.get(TOTALS_KEY)


class FinalValidation(L.Callback):
    """Validate the final weights of a run that reaches ``max_steps`` inside an epoch.

    Otherwise the run would end without validating them (its last ``val/*`` would be the previous
    epoch's). Asking to stop makes Lightning validate now, after every callback's batch end (weight
    averaging included); the checkpoints follow.
    """

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        max_steps = trainer.max_steps
        if max_steps is not None and 0 < max_steps <= trainer.global_step:
            trainer.should_stop = True


class ScheduleResume(L.Callback):
    """Put a resumable schedule at the restored step (a checkpoint without the schedule's state included)."""

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        for config in trainer.lr_scheduler_configs:
            scheduler = config.scheduler
            if isinstance(scheduler, ResumableSchedule) and scheduler.last_epoch != trainer.global_step:
                scheduler.resume_at(trainer.global_step)


def model_guarantees() -> list[L.Callback]:
    """The callbacks above, as the CLI installs them; add them to a ``Trainer`` built by hand (a notebook)."""
    return [CalibrationFit(), TrainingTotalsLog(), FinalValidation(), ScheduleResume()]


INSTALLED_FOR_MODEL = (CalibrationFit, TrainingTotalsLog, FinalValidation, ScheduleResume)
