"""The training step never waits for the device: nothing is read back to the host per step.

On a GPU, reading a device value on the host (``.item()``, ``float()``, ``bool()``, ``.tolist()``)
waits until every queued kernel has run, which starves the pipeline. A CPU run cannot feel that,
but it can count the reads: training for more steps, with logging, progress-bar refreshes and
validation out of the way, must not read more.
"""

from __future__ import annotations

import sys
from collections import Counter

import lightning as L
import pytest
import torch

from {{ cookiecutter.import_name }}.callbacks import GradScaleWatchdog
from {{ cookiecutter.import_name }}.cli import TrainerCLI
from {{ cookiecutter.import_name }}.data.cifar_format import CIFAR10

from .conftest import FAST_ARGS, PROJECT_ROOT, default_config, write_tiny_archive

READS = ("item", "__float__", "__int__", "__bool__", "tolist")
QUIET = [
    "--trainer.limit_val_batches=0",
    "--trainer.log_every_n_steps=1000",
    "--trainer.enable_progress_bar=false",
]
CONFIGS = {
    "default": [str(default_config()), "--model.backbone=FastCNN", "--model.backbone.width=4", "--data.batch_size=8"],
    # The fast recipe (CIFAR-10 whatever the default dataset), small and in fp32 on the CPU.
    "fast": [
        str(PROJECT_ROOT / "configs" / "cifar10_fast.yaml"),
        "--model.backbone=AirBench",
        "--model.backbone.width=4",
        "--data.global_batch_size=8",
    ],
}


class Window(L.Callback):
    """Count host reads from the first training batch to the end of training."""

    def __init__(self, counts: Counter, watchdog_reads_every_step: bool = False) -> None:
        self.counts = counts
        self.watchdog_reads_every_step = watchdog_reads_every_step

    def on_fit_start(self, trainer, pl_module) -> None:
        if self.watchdog_reads_every_step:  # the control: a callback that does read every step
            for callback in trainer.callbacks:
                if isinstance(callback, GradScaleWatchdog):
                    callback.check_every_n_steps = 1

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.counts["active"] = 1

    def on_train_end(self, trainer, pl_module) -> None:
        self.counts["active"] = 0


def host_reads(config: list[str], steps: int, root, monkeypatch, watchdog_reads_every_step: bool = False) -> Counter:
    counts: Counter = Counter()
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            if counts["active"]:
                counts[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    folder = root / str(steps)
    folder.mkdir()
    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "argv", ["main.py"])
    args = ["fit", "--config", *config[:1], *FAST_ARGS, *config[1:], *QUIET, "--data.data_dir=../data"]
    args += [f"--trainer.max_steps={steps}", "--trainer.precision=32-true"]
    window = Window(counts, watchdog_reads_every_step)
    TrainerCLI(default_config=default_config(), args=args, trainer_defaults={"callbacks": [window]})
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


def test_the_count_catches_a_per_step_read(tmp_path, monkeypatch):
    write_tiny_archive(tmp_path / "data")
    few = host_reads(CONFIGS["default"], 3, tmp_path, monkeypatch, watchdog_reads_every_step=True)
    more = host_reads(CONFIGS["default"], 9, tmp_path, monkeypatch, watchdog_reads_every_step=True)
    assert more["tolist"] > few["tolist"]  # one read of the watchdog's counts per step
