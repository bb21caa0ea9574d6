"""``ImageThroughput``: images per second of training and validation, timed by a clock the test drives."""

from __future__ import annotations

import functools

import lightning as L
import pytest
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from classifier_engine import ImageThroughput
from classifier_engine.callbacks import throughput as project_throughput

from .conftest import write_tiny_archive

pytestmark = pytest.mark.filterwarnings("ignore:.*does not have many workers.*:UserWarning")


def read_events(directory) -> EventAccumulator:
    events = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    events.Reload()
    return events


def tiny_fit(tmp_path, callbacks, max_steps, **trainer_kwargs) -> L.Trainer:
    """A real in-process fit of a tiny model of the CIFAR render on a tiny archive."""
    from cifar_classifier.data import CifarDataModule
    from cifar_classifier.models import ImageClassifier
    from cifar_classifier.models.backbones import FastCNN

    write_tiny_archive(tmp_path / "data")
    data = CifarDataModule(data_dir=str(tmp_path / "data"), verify_checksum=False, num_workers=0, batch_size=16,
                           val_size=32)  # fmt: skip
    model = ImageClassifier(backbone=functools.partial(FastCNN, width=4))
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=max_steps,
        limit_val_batches=2,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=callbacks,
        logger=TensorBoardLogger(tmp_path, name="tb", version=0),
        **trainer_kwargs,
    )
    trainer.fit(model, datamodule=data, weights_only=False)  # the backbone is a functools.partial
    return trainer


class FakeClock(L.Callback):
    """The throughput monitor's clock: each training batch takes 1 s, each validation batch 10 s."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def on_train_batch_start(self, *args) -> None:
        self.now += 1.0

    def on_validation_batch_start(self, *args) -> None:
        self.now += 10.0


def test_throughput_after_a_validation_between_logging_steps_counts_every_training_batch_time(tmp_path, monkeypatch):
    # Logged at steps 4 and 8, validated after step 6: the rate at step 8 spans steps 5 to 8 (or 7
    # and 8), whose time must not be dropped with the validation's.
    clock = FakeClock()
    monkeypatch.setattr(project_throughput, "time", clock)
    trainer = tiny_fit(tmp_path, [clock, ImageThroughput()], max_steps=10, val_check_interval=6, log_every_n_steps=4)
    rates = read_events(trainer.logger.log_dir).Scalars("train/device/samples_per_sec")
    # Lightning's step index of the 8th batch (the 4th has no window yet); 16 images per 1-s batch
    # (32 when steps 5 and 6 lost their time)
    assert [(rate.step, rate.value) for rate in rates] == [(7, 16.0)]
    validation = read_events(trainer.logger.log_dir).Scalars("val/device/samples_per_sec")
    assert validation and all(rate.value == pytest.approx(16 / 10) for rate in validation)  # 16 images per 10-s batch
