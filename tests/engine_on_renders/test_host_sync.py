"""The training step never waits for the device: nothing is read back to the host per step.

On a GPU, reading a device value on the host (``.item()``, ``float()``, ``bool()``, ``.tolist()``,
``.cpu()``, ``.numpy()``, formatting it) waits until every queued kernel has run, which starves
the pipeline. A CPU run cannot feel that, but it can count the reads: more training steps must
not read more. Quiet runs (no logging, no validation) count the step alone; observed runs log,
validate and act on their every-N-steps callbacks as often in a short run as in a long one (once
per epoch, two epochs), so a read that grows with the steps shows up there too: in fp32,
bf16-mixed and fp16 with torch's loss scaler.
"""

from __future__ import annotations

import json
import sys
from collections import Counter

import lightning as L
import pytest
import torch
from cifar_classifier.callbacks import GradientHistograms, GradScaleWatchdog
from cifar_classifier.models import ImageClassifier
from lightning.pytorch.callbacks import ModelCheckpoint

from classifier_engine.cli.trainer_cli import TrainerCLI
from classifier_engine.data.cifar_format import CIFAR10
from classifier_engine.faults.divergence import DivergenceGuard
from classifier_engine.models.calibration import Calibration

from .conftest import FAST_ARGS, PROJECT_ROOT, default_config, write_tiny_archive

READS = ("item", "__float__", "__int__", "__bool__", "tolist", "cpu", "numpy", "__format__")
QUIET = [
    "--trainer.limit_val_batches=0",
    "--trainer.log_every_n_steps=1000",
    "--trainer.enable_progress_bar=false",
]
CONFIGS = {
    "default": [
        str(default_config()),
        "--model.backbone=cifar_classifier.models.backbones.FastCNN",
        "--model.backbone.width=4",
        "--data.batch_size=8",
    ],
    # The fast recipe (CIFAR-10 whatever the default dataset), small and in fp32 on the CPU.
    "fast": [
        str(PROJECT_ROOT / "configs" / "cifar10_fast.yaml"),
        "--model.backbone=cifar_classifier.models.backbones.AirBench",
        "--model.backbone.width=4",
        "--data.global_batch_size=8",
    ],
}
# fp16 with a GradScaler, on the CPU: Lightning's --trainer.precision 16-mixed would become bf16 here.
# A loss scale of 1 from the start: the default 65536 overflows in the first steps, and how many of them a
# run skips depends on its data, not on how many steps it takes.
SCALER = {"class_path": "torch.amp.GradScaler", "init_args": {"device": "cpu", "init_scale": 1.0}}
MIXED_FP16_ON_CPU = {
    "class_path": "lightning.pytorch.plugins.MixedPrecision",
    "init_args": {"precision": "16-mixed", "device": "cpu", "scaler": SCALER},
}
PRECISIONS = {
    "32-true": ["--trainer.precision=32-true"],
    "bf16-mixed": ["--trainer.precision=bf16-mixed"],
    "16-mixed": ["--trainer.precision=null", f"--trainer.plugins+={json.dumps(MIXED_FP16_ON_CPU)}"],
}


class Window(L.Callback):
    """Count host reads from the first training batch to the end of training."""

    def __init__(self, counts: Counter, every_n_steps: int | None = None, watchdog_reads_every_step: bool = False):
        self.counts = counts
        self.every_n_steps = every_n_steps
        self.watchdog_reads_every_step = watchdog_reads_every_step

    def on_fit_start(self, trainer, pl_module) -> None:
        for callback in trainer.callbacks:
            if isinstance(callback, GradScaleWatchdog):
                if self.watchdog_reads_every_step:  # the control: a callback that does read every step
                    callback.check_every_n_steps = 1
                elif self.every_n_steps:
                    callback.check_every_n_steps = self.every_n_steps
            if isinstance(callback, GradientHistograms) and self.every_n_steps:
                callback.every_n_steps = self.every_n_steps
            if isinstance(callback, DivergenceGuard) and self.every_n_steps:  # it reads its counts every N steps
                callback.check_every_n_steps = self.every_n_steps
            if isinstance(callback, ModelCheckpoint) and callback.monitor and self.every_n_steps:
                callback.save_top_k = -1  # a save at every validation, not only when val/top1 happens to improve

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.counts["active"] = 1

    def on_train_end(self, trainer, pl_module) -> None:
        self.counts["active"] = 0


def host_reads(
    config: list[str], steps: int, root, monkeypatch, *, observed: bool = False, precision: str = "32-true", **window
) -> Counter:
    """Reads during a run of ``steps`` steps: quiet, or ``observed`` (two epochs of ``steps // 2`` batches)."""
    counts: Counter = Counter()
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            if counts["active"]:
                counts[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    fit_calibration = Calibration.fit

    def uncounted_fit(self, *args):  # once per validation, on the CPU; how many reads depends on LBFGS's iterations
        active, counts["active"] = counts["active"], 0
        try:
            return fit_calibration(self, *args)
        finally:
            counts["active"] = active

    monkeypatch.setattr(Calibration, "fit", uncounted_fit)
    folder = root / f"{steps}-{precision}-{observed}"
    folder.mkdir()
    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "argv", ["main.py"])
    args = ["fit", "--config", *config[:1], *FAST_ARGS, *config[1:], "--data.data_dir=../data"]
    if observed:
        per_epoch = steps // 2
        args += ["--trainer.max_epochs=2", f"--trainer.limit_train_batches={per_epoch}"]
        args += ["--trainer.limit_val_batches=1", f"--trainer.log_every_n_steps={per_epoch}"]
        window.setdefault("every_n_steps", per_epoch)
    else:
        args += [*QUIET, f"--trainer.max_steps={steps}"]
    args += PRECISIONS[precision]
    recorder = Window(counts, **window)
    TrainerCLI(ImageClassifier, default_config=default_config(), args=args, trainer_defaults={"callbacks": [recorder]})
    del counts["active"]
    return counts


pytestmark = [
    pytest.mark.filterwarnings("ignore:The number of training batches .* is smaller than the logging interval"),
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*:UserWarning"),
    pytest.mark.filterwarnings("ignore:`ModelCheckpoint\\(monitor='val/top1'\\)` could not find the monitored key"),
]


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_training_steps_read_nothing_back_from_the_device(tmp_path, monkeypatch, config):
    write_tiny_archive(tmp_path / "data", *([CIFAR10] if config == "fast" else []))
    few = host_reads(CONFIGS[config], 3, tmp_path, monkeypatch)
    more = host_reads(CONFIGS[config], 9, tmp_path, monkeypatch)
    assert sum(few.values()) > 0  # the counter is live: the end of training does read (checkpoint, metrics)
    assert more == few, f"{config}: 6 more steps read {more - few} more values on the host"


@pytest.mark.parametrize("precision", sorted(PRECISIONS))
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_logging_and_validation_read_per_event_not_per_step(tmp_path, monkeypatch, config, precision):
    write_tiny_archive(tmp_path / "data", *([CIFAR10] if config == "fast" else []))
    few = host_reads(CONFIGS[config], 4, tmp_path, monkeypatch, observed=True, precision=precision)
    more = host_reads(CONFIGS[config], 12, tmp_path, monkeypatch, observed=True, precision=precision)
    assert few["item"] > 0 and few["cpu"] > 0  # logging and validation did read, at their events
    assert more == few, f"{config} {precision}: 8 more steps read {more - few} more values on the host"


def test_the_count_catches_a_per_step_read(tmp_path, monkeypatch):
    write_tiny_archive(tmp_path / "data")
    few = host_reads(CONFIGS["default"], 3, tmp_path, monkeypatch, watchdog_reads_every_step=True)
    more = host_reads(CONFIGS["default"], 9, tmp_path, monkeypatch, watchdog_reads_every_step=True)
    assert more["tolist"] > few["tolist"]  # one read of the watchdog's counts per step


def test_the_count_catches_the_loss_scalers_read_of_an_unfused_optimizer(tmp_path, monkeypatch):
    # torch's GradScaler reads found_inf on the host every step unless the optimizer is fused (it then
    # takes the scale and skips the step on the device): why the configs set fused: true.
    unfused = [*CONFIGS["default"], "--model.optimizer.init_args.fused=false"]
    write_tiny_archive(tmp_path / "data")
    few = host_reads(unfused, 4, tmp_path, monkeypatch, observed=True, precision="16-mixed")
    more = host_reads(unfused, 12, tmp_path, monkeypatch, observed=True, precision="16-mixed")
    assert more["item"] - few["item"] == 8  # found_inf, once per step
