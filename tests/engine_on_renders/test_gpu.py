"""What only a CUDA device can show: ``python -m pytest -m gpu`` on a machine with one (skipped elsewhere).

The training step must not synchronise with the host (``torch.cuda.set_sync_debug_mode("error")``
turns any sync into an exception; ``torch.cuda.synchronize`` runs only at logging steps),
``data.storage: auto`` must keep the data on the GPU, ``trainer.deterministic`` must make reruns
bit-identical, and ``trainer.sync_batchnorm`` must convert and train; each with the default config
and the fast recipe as a user runs them (bf16, ``compile``); and ``classifier_engine.bench recipe
--quick`` runs on the GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys

import lightning as L
import pytest
import torch
from cifar_classifier.callbacks import GradientHistograms, GradScaleWatchdog
from cifar_classifier.models import ImageClassifier

from classifier_engine.cli.trainer_cli import TrainerCLI
from classifier_engine.data.cifar_format import CIFAR10

from .conftest import FAST_ARGS, PROJECT_ROOT, cli_env, default_config, write_tiny_archive

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
    return TrainerCLI(
        ImageClassifier, default_config=default_config(), args=args, trainer_defaults={"callbacks": list(callbacks)}
    )


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_training_steps_never_sync_with_the_host_on_cuda(tmp_path, monkeypatch, config, compiled):
    write_tiny_archive(tmp_path / "data", *([CIFAR10] if config == "fast" else []))
    guard = NoSyncInTrainingSteps()
    extra = ["--trainer.max_steps=6", "--trainer.log_every_n_steps=1000", f"--model.compile={str(compiled).lower()}"]
    cli = fit_in_process(CONFIGS[config], tmp_path, monkeypatch, *extra, callbacks=[guard])
    assert guard.steps == 6 and cli.trainer.global_step == 6


def test_the_host_waits_for_the_gpu_only_at_logging_steps(tmp_path, monkeypatch):
    # Lightning's ThroughputMonitor calls torch.cuda.synchronize after every batch; ImageThroughput
    # only at the steps the logger writes (and the benchmark clock not at all here).
    write_tiny_archive(tmp_path / "data", CIFAR10)
    waits = []

    class CountWaitsWhileTraining(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            self.counting = True

        def on_train_end(self, trainer, pl_module) -> None:
            self.counting = False

    counter = CountWaitsWhileTraining()
    counter.counting = False
    synchronize = torch.cuda.synchronize
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: waits.append(counter.counting) or synchronize(*args))
    extra = ["--trainer.max_steps=12", "--trainer.log_every_n_steps=4", "--trainer.check_val_every_n_epoch=1000"]
    cli = fit_in_process(CONFIGS["fast"], tmp_path, monkeypatch, *extra, callbacks=[counter])
    assert cli.trainer.global_step == 12 and sum(waits) <= 12 // 4  # steps 4, 8 and 12


def test_the_recipe_benchmark_runs_on_cuda(tmp_path):
    write_tiny_archive(tmp_path / "data", CIFAR10)
    result = subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "benchmarks" / "bench_recipe.py"), "--quick", "--device", "cuda",
         "--seeds", "2", "--data_dir", "data", "--data.verify_checksum=false"],
        cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert 0 <= figures["project_top1"] <= 1 and 0 < figures["project_final_eval_s"] < figures["project_s"]


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
