"""What only a CUDA device can show: ``python -m pytest -m gpu`` on a machine with one (skipped elsewhere).

The training step must not synchronise with the host (``torch.cuda.set_sync_debug_mode("error")``
turns any sync into an exception), ``data.storage: auto`` must keep the data on the GPU,
``trainer.deterministic`` must make reruns bit-identical, and ``trainer.sync_batchnorm`` must
convert and train; each with the default config and the fast recipe as a user runs them
(bf16, ``compile``).
"""

from __future__ import annotations

import sys

import lightning as L
import pytest
import torch

from {{ cookiecutter.import_name }}.callbacks import GradientHistograms, GradScaleWatchdog
from {{ cookiecutter.import_name }}.cli import TrainerCLI
from {{ cookiecutter.import_name }}.data.cifar_format import CIFAR10

from .conftest import FAST_ARGS, PROJECT_ROOT, default_config, write_tiny_archive

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*:UserWarning"),
    pytest.mark.filterwarnings("ignore:The number of training batches .* is smaller than the logging interval"),
]
ON_CUDA = ["--trainer.accelerator=gpu", "--trainer.devices=1", "--data.storage=auto"]
CONFIGS = {
    "default": [str(default_config()), "--trainer.precision=bf16-mixed"],
    "fast": [str(PROJECT_ROOT / "configs" / "cifar10_fast.yaml"), "--data.global_batch_size=64"],
}


class NoSyncInTrainingSteps(L.Callback):
    """Any host sync from the batch's start to its optimizer step raises (the every-N callbacks are held off)."""

    def __init__(self) -> None:
        self.steps = 0

    def on_fit_start(self, trainer, pl_module) -> None:
        for callback in trainer.callbacks:
            if isinstance(callback, GradScaleWatchdog):
                callback.check_every_n_steps = 10**9  # its read is a sync by design, on its own steps
            if isinstance(callback, GradientHistograms):
                callback.every_n_steps = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        torch.cuda.set_sync_debug_mode("error")

    def on_before_zero_grad(self, trainer, pl_module, optimizer) -> None:
        torch.cuda.set_sync_debug_mode("default")
        self.steps += 1

    def on_exception(self, trainer, pl_module, exception) -> None:
        torch.cuda.set_sync_debug_mode("default")


def fit_in_process(config: list[str], root, monkeypatch, *extra: str, callbacks=()) -> TrainerCLI:
    monkeypatch.chdir(root)
    monkeypatch.setattr(sys, "argv", ["main.py"])
    args = ["fit", "--config", config[0], *FAST_ARGS, *ON_CUDA, *config[1:], "--data.data_dir=data", *extra]
    return TrainerCLI(default_config=default_config(), args=args, trainer_defaults={"callbacks": list(callbacks)})


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_training_steps_never_sync_with_the_host_on_cuda(tmp_path, monkeypatch, config, compiled):
    write_tiny_archive(tmp_path / "data", *([CIFAR10] if config == "fast" else []))
    guard = NoSyncInTrainingSteps()
    extra = ["--trainer.max_steps=6", "--trainer.log_every_n_steps=1000", f"--model.compile={str(compiled).lower()}"]
    cli = fit_in_process(CONFIGS[config], tmp_path, monkeypatch, *extra, callbacks=[guard])
    assert guard.steps == 6 and cli.trainer.global_step == 6


def test_storage_auto_keeps_the_data_on_the_gpu(tmp_path, monkeypatch):
    write_tiny_archive(tmp_path / "data")
    cli = fit_in_process(CONFIGS["default"], tmp_path, monkeypatch, "--trainer.max_steps=2")
    assert cli.datamodule.resident and all(
        split.tensors[0].device.type == "cuda" for split in cli.datamodule.resident.values()
    )


def test_deterministic_reruns_are_bit_identical_on_cuda(tmp_path, monkeypatch):
    write_tiny_archive(tmp_path / "data")
    weights = []
    for name in ("first", "second"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "data").symlink_to(tmp_path / "data")
        extra = ["--trainer.max_steps=6", "--trainer.deterministic=true"]
        cli = fit_in_process(CONFIGS["default"], folder, monkeypatch, *extra)
        weights.append({key: value.detach().cpu().clone() for key, value in cli.model.state_dict().items()})
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][key], weights[1][key]) for key in weights[0])


def test_sync_batchnorm_converts_the_norms_and_trains(tmp_path, monkeypatch):
    write_tiny_archive(tmp_path / "data")
    extra = ["--config", str(PROJECT_ROOT / "configs" / "presets" / "ddp.yaml"), "--trainer.sync_batchnorm=true"]
    extra += ["--trainer.devices=1", "--trainer.max_steps=2"]
    cli = fit_in_process(CONFIGS["default"], tmp_path, monkeypatch, *extra)
    modules = list(cli.model.modules())
    assert any(isinstance(m, torch.nn.SyncBatchNorm) for m in modules)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in modules)
    assert cli.trainer.global_step == 2
