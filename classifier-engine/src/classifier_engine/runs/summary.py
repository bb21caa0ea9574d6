"""The lines a command prints when it ends: where everything went, and how it went."""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import MLFlowLogger

from ..checkpoints.checkpoint_io import stored_entry
from ..data.interfaces import BatchPlan, DataSummary, ValidationSplit
from .run import Run


def _number(value: float) -> str:
    return f"{value:.4f}" if abs(value) < 1000 else f"{value:,.0f}"


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {seconds:02d}s" if hours else f"{minutes}m {seconds:02d}s"


def fit_summary(trainer: L.Trainer, run: Run) -> str:
    """Run directory, best and last checkpoints, final metrics, time and throughput of a finished fit."""
    session = run.session
    lines = [f"Run: {run.directory}" + (f" (resumed from {run.checkpoint})" if run.checkpoint else "")]
    named = set()  # last.ckpt may have two writers (by epoch and by step)
    for callback in trainer.checkpoint_callbacks:
        if not isinstance(callback, ModelCheckpoint):
            continue
        if callback.monitor and callback.best_model_path and Path(callback.best_model_path).is_file():
            score = _number(float(callback.best_model_score)) if callback.best_model_score is not None else "?"
            epoch = stored_entry(callback.best_model_path, "epoch")
            epoch = "?" if epoch is None else epoch
            lines.append(f"Best checkpoint: {callback.best_model_path} ({callback.monitor} {score} at epoch {epoch})")
        elif callback.monitor is None and (callback.last_model_path or callback.best_model_path):
            latest = callback.last_model_path or callback.best_model_path  # without a monitor: the latest save
            step = stored_entry(latest, "global_step")  # what the file holds (a diverged run's last save is older)
            if latest not in named and step is not None:
                named.add(latest)
                lines.append(f"Last checkpoint: {latest} (step {step})")
    metrics = {
        name.removesuffix("_epoch"): float(value)
        for name, value in sorted(trainer.callback_metrics.items())
        if name.startswith(("train/", "val/")) and not name.endswith("_step") and value.numel() == 1
    }
    if metrics:
        lines.append("Final metrics: " + "  ".join(f"{name} {_number(value)}" for name, value in metrics.items()))
    answers = unknown_summary(trainer.lightning_module)
    if answers:
        lines.append(answers)
    if session.diverged:
        listed = any(line.startswith(("Best checkpoint", "Last checkpoint")) for line in lines)
        kept = "the checkpoints above hold finite weights" if listed else "no checkpoint was written"
        lines.append(f"Diverged: {session.diverged}; {kept}")
    if session.steps_taken == 0:
        lines.append(
            "Nothing left to train: the run had already reached trainer.max_epochs/max_steps; to extend it, "
            "raise them and add --allow_config_change true"
        )
    else:
        seconds = max(session.elapsed, 1e-9)
        lines.append(
            f"Time: {_duration(seconds)} for {session.steps_taken} steps this session "
            f"({session.images / seconds:,.0f} images/s)"
        )
    if isinstance(trainer.datamodule, DataSummary) and trainer.datamodule.data_summary():
        lines.append(f"Data: {trainer.datamodule.data_summary()}")
    if isinstance(trainer.datamodule, BatchPlan) and trainer.datamodule.batches is not None:
        lines.append(f"Batch: {trainer.datamodule.batches.describe()}")
    if isinstance(trainer.datamodule, ValidationSplit) and trainer.datamodule.validates_on_test_set:
        lines.append(
            "Note: data.val_size is 0, so val/* was measured on the test set and the best checkpoint was chosen "
            "on it; set data.val_size to hold out training images for an unbiased choice"
        )
    if trainer.logger is not None and trainer.logger.save_dir:
        lines.append(f"TensorBoard: tensorboard --logdir {Path(trainer.logger.save_dir)}")
    for logger in trainer.loggers:
        if isinstance(logger, MLFlowLogger):
            import mlflow  # installed: the logger needs it; the logger set its URI as mlflow's when it started the run

            lines.append(f"MLflow: run {logger.run_id}; mlflow ui --backend-store-uri {mlflow.get_tracking_uri()}")
    return "\n".join(lines)


def unknown_summary(model: L.LightningModule) -> str:
    """What the last validation's calibration says of the answers a user will get (empty before any)."""
    fitted = getattr(model, "calibration", None) and model.calibration.fitted
    if not fitted:
        return ""
    parts = []
    if "labels_given" in fitted:
        parts.append(f"{fitted['labels_given']:.1f} labels given per image, {fitted['labels_true']:.1f} true")
    if "in_domain" in fitted and model.calibration.reject_with != "none":
        parts.append(f"{100 * fitted['in_domain']:.1f} % like the training images by {model.calibration.reject_with}")
    if "coverage" in fitted:
        parts.append(f"{100 * fitted['coverage']:.1f} % answered")
    return "Answers on validation: " + "; ".join(parts) if parts else ""


def evaluation_summary(trainer: L.Trainer, run: Run) -> str:
    """Where a validate/test/predict command logged, and which checkpoint it evaluated."""
    evaluated = run.checkpoint or "the untrained model (no --ckpt_path)"
    line = f"{run.subcommand.capitalize()} of {evaluated} logged to {run.directory}"
    report = Path(run.directory) / "report.html"
    return f"{line}\nReport: {report}" if run.subcommand == "test" and report.is_file() else line
