"""The observability callbacks, each checked by reading back what it logged."""

from __future__ import annotations

import functools
import warnings
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.plugins import MixedPrecision
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from classifier_engine import ConfusionMatrix, ModelReport, SampleGrid

from {{ cookiecutter.import_name }}.callbacks import GradientHistograms, GradScaleWatchdog
from {{ cookiecutter.import_name }}.models import ImageClassifier
from {{ cookiecutter.import_name }}.models.backbones import FastCNN

pytestmark = pytest.mark.filterwarnings("ignore:.*does not have many workers.*:UserWarning")


def read_events(directory) -> EventAccumulator:
    events = EventAccumulator(str(directory), size_guidance={"histograms": 0, "images": 0, "scalars": 0})
    events.Reload()
    return events


def tiny_fit(data, tmp_path, callbacks, max_steps=4, optimizer=None, ckpt_path=None, **trainer_kwargs):
    """A real in-process fit of a tiny model on the project's DataModule; returns the trainer."""
    model = ImageClassifier(
        num_classes=data.num_classes,
        class_names=data.class_names,
        backbone=functools.partial(FastCNN, width=4),
        optimizer=optimizer,
    )
    trainer_kwargs.setdefault("logger", TensorBoardLogger(tmp_path, name="tb", version=0))
    trainer_kwargs = {"val_check_interval": max_steps, "log_every_n_steps": 1, **trainer_kwargs}
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=max_steps,
        limit_val_batches=2,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=callbacks,
        **trainer_kwargs,
    )
    # weights_only=False: the backbone here is a functools.partial, which lands in the hparams
    trainer.fit(model, datamodule=data, ckpt_path=ckpt_path, weights_only=False)
    return trainer


def test_histograms_and_norms_every_n_steps(project_data, tmp_path):
    trainer = tiny_fit(project_data, tmp_path, [GradientHistograms(every_n_steps=2)], max_steps=5)
    events = read_events(trainer.logger.log_dir)
    histograms = events.Tags()["histograms"]
    assert "weights/backbone.0.weight" in histograms and "weights_grad/backbone.0.weight" in histograms
    assert [e.step for e in events.Histograms("weights_grad/backbone.0.weight")] == [0, 2, 4]
    total = events.Scalars("weights_grad_norm/total")
    assert [e.step for e in total] == [0, 2, 4] and all(e.value > 0 for e in total)
    assert all(e.value == 0 for e in events.Scalars("weights_grad_nonfinite/total"))


def test_nonfinite_gradients_are_counted_not_drawn(tmp_path):
    module = torch.nn.Linear(3, 2)
    module.weight.grad = torch.full((2, 3), float("inf"))
    module.bias.grad = torch.tensor([1.0, float("nan")])
    logger = TensorBoardLogger(tmp_path, name="tb", version=0)
    trainer = SimpleNamespace(global_step=0, is_global_zero=True, loggers=[logger], fast_dev_run=False)
    GradientHistograms(every_n_steps=1).on_before_optimizer_step(trainer, module, optimizer=None)
    logger.experiment.flush()
    events = read_events(logger.log_dir)
    assert events.Scalars("weights_grad_nonfinite/total")[0].value == 7
    assert events.Scalars("weights_grad_nonfinite/weight")[0].value == 6
    assert "weights_grad/weight" not in events.Tags()["histograms"]  # all inf: nothing finite to draw
    assert "weights_grad/bias" in events.Tags()["histograms"]


def test_without_tensorboard_it_warns_once_and_keeps_the_scalars(project_data, tmp_path):
    logger = CSVLogger(tmp_path, name="csv", version=0)
    with pytest.warns(UserWarning, match="no TensorBoardLogger attached") as warned:
        tiny_fit(project_data, tmp_path, [GradientHistograms(every_n_steps=1)], max_steps=3, logger=logger)
    assert sum("no TensorBoardLogger" in str(w.message) for w in warned) == 1
    header = (tmp_path / "csv" / "version_0" / "metrics.csv").read_text().splitlines()[0]
    assert "weights_grad_norm/total" in header


def test_sample_grid_and_confusion_matrix(project_data, tmp_path):
    trainer = tiny_fit(project_data, tmp_path, [SampleGrid(num_images=16, images_per_row=4), ConfusionMatrix()])
    events = read_events(trainer.logger.log_dir)
    (grid,) = events.Images("train/augmented_batch")
    assert grid.step == 0 and grid.width == 4 * 34 + 2 and grid.height == 4 * 34 + 2
    (figure,) = events.Images("val/confusion_matrix")
    (validation,) = events.Scalars("val/top1")
    assert figure.step == validation.step  # beside the scalars of the same validation
    if trainer.datamodule.num_classes <= 20:
        assert figure.width == 400  # shown unscaled at TensorBoard's default size, names and values legible
    else:
        assert 400 < figure.width <= 1600  # a hundred names need more room
    per_class = [tag for tag in events.Tags()["scalars"] if tag.startswith("val_class_top1/")]
    assert len(per_class) == trainer.datamodule.num_classes
    assert {events.Scalars(tag)[0].step for tag in per_class} == {validation.step}


def fp16_on_cpu(init_scale: float) -> MixedPrecision:
    """A real fp16 GradScaler on CPU (``precision="16-mixed"`` alone would become bf16 there)."""
    return MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", init_scale=init_scale))


def test_watchdog_logs_the_scale_of_a_healthy_fp16_run(project_data, tmp_path):
    watchdog = GradScaleWatchdog()
    trainer = tiny_fit(project_data, tmp_path, [watchdog], plugins=[fp16_on_cpu(2.0**10)])
    events = read_events(trainer.logger.log_dir)
    assert [e.value for e in events.Scalars("amp/scale")] == [2.0**10] * 4
    assert watchdog.skipped_steps == 0 and trainer.global_step == 4  # not stopped before max_steps


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before:UserWarning")  # skipped steps
def test_watchdog_ends_the_run_as_diverged_after_consecutive_overflows(project_data, tmp_path):
    watchdog = GradScaleWatchdog(max_consecutive_skips=3, check_every_n_steps=1)
    with pytest.raises(FloatingPointError, match=r"3 optimizer steps in a row were skipped .* by step 3"):
        tiny_fit(project_data, tmp_path, [watchdog], max_steps=8, plugins=[fp16_on_cpu(1e38)])
    assert watchdog.skipped_steps == 3
    events = read_events(next(tmp_path.rglob("events.out.tfevents.*")).parent)
    scales = [e.value for e in events.Scalars("amp/scale")]
    assert scales == sorted(scales, reverse=True) and scales[0] < 1e38  # halved on every skipped step


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before:UserWarning")  # skipped steps
def test_watchdog_reads_its_counts_only_every_n_steps_and_stops_at_the_next_read(project_data, tmp_path):
    watchdog = GradScaleWatchdog(max_consecutive_skips=2, check_every_n_steps=3)
    with pytest.raises(FloatingPointError, match=r"2 optimizer steps in a row were skipped .* by step 3"):
        tiny_fit(project_data, tmp_path, [watchdog], max_steps=8, plugins=[fp16_on_cpu(1e38)])
    assert watchdog.skipped_steps == 3  # two skips in a row by step 2, read at 3


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before:UserWarning")  # skipped steps
@pytest.mark.parametrize(
    ("init_scale", "overflowing"), [(1e38, True), (2.0**10, False)], ids=["overflowing", "healthy"]
)
def test_watchdog_warns_once_below_its_scale_floor_and_above_its_skip_rate(
    project_data, tmp_path, init_scale, overflowing
):
    # Never stops (max_consecutive_skips=0): only the two warnings are under test. Every step of the
    # overflowing run is skipped and halves the scale, from 1e38 to below the 1e37 floor.
    floor = 1e37 if overflowing else 1.0
    watchdog = GradScaleWatchdog(
        scale_floor=floor, max_skip_rate=0.5, window=4, max_consecutive_skips=0, check_every_n_steps=1
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = tiny_fit(project_data, tmp_path, [watchdog], max_steps=6, plugins=[fp16_on_cpu(init_scale)])
    messages = [str(w.message) for w in caught if "GradScaleWatchdog" in str(w.message)]
    below_floor = [m for m in messages if "the fp16 loss scale fell to" in m and f"(< {floor:g})" in m]
    too_many_skips = [m for m in messages if "of the last 4 optimizer steps were skipped (> 50%)" in m]
    assert trainer.global_step == 6  # warned, never stopped
    if overflowing:
        assert watchdog.skipped_steps == 6 and len(below_floor) == 1 and len(too_many_skips) == 1, messages
    else:
        assert watchdog.skipped_steps == 0 and not below_floor and not too_many_skips, messages


@pytest.mark.parametrize(("threshold", "warned"), [(1e-6, True), (1000.0, False)], ids=["above", "below"])
def test_model_report_warns_above_its_gflops_threshold(project_data, tmp_path, threshold, warned):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tiny_fit(project_data, tmp_path, [ModelReport(warn_above_gflops=threshold)], max_steps=1)
    above = [str(w.message) for w in caught if "GFLOPs per image is above" in str(w.message)]
    assert len(above) == (1 if warned else 0), above
    if warned:
        assert f"the {threshold:g} GFLOPs threshold" in above[0]


def test_watchdog_without_a_scaler_watches_the_loss(project_data, tmp_path):
    watchdog = GradScaleWatchdog(max_consecutive_skips=2)
    trainer = tiny_fit(project_data, tmp_path, [watchdog])
    assert watchdog.skipped_steps == 0 and trainer.global_step == 4
    events = read_events(trainer.logger.log_dir)
    assert not any(tag.startswith("amp/") for tag in events.Tags()["scalars"])  # nothing to chart without a scaler


def test_watchdog_stops_a_diverged_fp32_run(project_data, tmp_path):
    watchdog = GradScaleWatchdog(max_consecutive_skips=2, check_every_n_steps=1)
    with pytest.raises(FloatingPointError, match="optimizer steps in a row were skipped"):
        tiny_fit(project_data, tmp_path, [watchdog], max_steps=8, optimizer=functools.partial(torch.optim.SGD, lr=1e30))
    assert watchdog.skipped_steps >= 2
