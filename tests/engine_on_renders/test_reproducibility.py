"""Reproducible runs: identical reruns, exact resume after SIGKILL, crash-safe checkpoints, config checks."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
import torch
from cifar_classifier.models import ImageClassifier

from classifier_engine.checkpoints.checkpoint_io import AtomicCheckpointIO

from .conftest import (
    cli_env,
    fit_args,
    run_cli,
    write_tiny_archive,
)

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*:UserWarning"),
    pytest.mark.filterwarnings("ignore:You're resuming from a checkpoint that ended before the epoch ended"),
    pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty:UserWarning"),
]


def in_process(args, cwd, monkeypatch):
    from classifier_engine.cli.trainer_cli import TrainerCLI

    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", ["main.py"])
    return TrainerCLI(ImageClassifier, args=args)


def weights(checkpoint_path):
    return torch.load(checkpoint_path, weights_only=True)["state_dict"]


def assert_same_weights(first, second):
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), f"{name} differs"


def test_two_runs_of_one_config_are_identical(tmp_path, monkeypatch):
    runs = []
    for attempt in ("a", "b"):
        write_tiny_archive(tmp_path / attempt / "data")
        cli = in_process(fit_args("data", "--trainer.max_epochs=2"), tmp_path / attempt, monkeypatch)
        runs.append((cli.model.state_dict(), {k: float(v) for k, v in cli.trainer.callback_metrics.items()}))
    assert_same_weights(runs[0][0], runs[1][0])
    assert runs[0][1] == runs[1][1]


@pytest.mark.slow  # processes killed and restarted
def test_sigterm_saves_a_checkpoint_and_the_run_continues_from_it(tmp_path):
    args = fit_args(
        "data", "--trainer.max_epochs=3", "--data.batch_size=8", "--trainer.callbacks+=engine_probes.KillAt"
    )
    write_tiny_archive(tmp_path / "data")
    steps_per_epoch = (192 - 32) // 8
    # SIGTERM after batch 6 of epoch 1 (a scheduler's pre-emption); Lightning stops at the next boundary.
    stopped = run_cli(*args, cwd=tmp_path, check=False, env={"KILL_AT": "train_batch:1:6", "KILL_SIGNAL": "SIGTERM"})
    (last,) = tmp_path.glob("runs/*/*/checkpoints/last.ckpt")
    stopped_at = torch.load(last, weights_only=True)["global_step"]
    assert stopped_at == steps_per_epoch + 7, "saved at the signal, mid-epoch"
    assert stopped.returncode == 128 + signal.SIGTERM, "a stopped run must not look finished to a job script"
    assert f"Stopped by SIGTERM at step {stopped_at}; " in stopped.stdout
    assert f"holds step {stopped_at}" in stopped.stdout

    run_cli(*args, "--ckpt_path=last", cwd=tmp_path)
    assert torch.load(last, weights_only=True)["global_step"] == 3 * steps_per_epoch


WRITER = """
import sys, torch
from classifier_engine.checkpoints.checkpoint_io import AtomicCheckpointIO
io = AtomicCheckpointIO()
payload = {"state_dict": {"w": torch.zeros(4_000_000)}}
i = 0
while True:
    payload["step"] = i
    io.save_checkpoint(payload, sys.argv[1])
    print(i, flush=True)
    i += 1
"""


@pytest.mark.slow  # processes killed and restarted
def test_a_kill_during_a_checkpoint_write_never_leaves_a_broken_checkpoint(tmp_path):
    target = tmp_path / "checkpoints" / "last.ckpt"
    for delay in (0.05, 0.13, 0.21, 0.37):
        process = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(target)], env=cli_env(), stdout=subprocess.PIPE, text=True
        )
        process.stdout.readline()  # one complete checkpoint exists
        time.sleep(delay)
        process.send_signal(signal.SIGKILL)
        process.wait()
        process.stdout.close()
        assert torch.load(target, weights_only=True)["state_dict"]["w"].shape == (4_000_000,)
    AtomicCheckpointIO().save_checkpoint({"step": -1}, target)
    assert sorted(p.name for p in target.parent.iterdir()) == ["last.ckpt"]  # stale temporaries cleaned


@pytest.fixture
def finished(tmp_path, monkeypatch):
    write_tiny_archive(tmp_path / "data")
    in_process(
        fit_args("data", "--model.lr_schedule=cifar_classifier.models.schedules.Constant"), tmp_path, monkeypatch
    )
    (last,) = tmp_path.glob("runs/*/*/checkpoints/last.ckpt")
    return tmp_path, last


def test_resuming_under_a_changed_config_is_allowed_by_the_switch(finished, monkeypatch):
    root, last = finished
    run_dir = last.parents[1]
    schedule, smoothing = (
        "--model.lr_schedule=cifar_classifier.models.schedules.Constant",
        "--model.label_smoothing=0.2",
    )
    changed = fit_args("data", "--trainer.max_epochs=2", schedule, smoothing, f"--ckpt_path={last}")
    # (refused without the switch: tests/test_runs.py, the "changed-config" mistake)
    cli = in_process([*changed, "--allow_config_change=true"], root, monkeypatch)
    assert cli.trainer.current_epoch == 2 and cli.run.directory.resolve() == run_dir.resolve()  # the same run
    assert cli.model.hparams.label_smoothing == 0.2  # the allowed change is in force, not the checkpoint's value
    old_hash, new_hash = (run_dir / "config_hash.txt").read_text().split()
    assert new_hash == cli.run.identity.hash != old_hash
    assert (run_dir / "config.yaml").is_file() and (run_dir / f"config-{new_hash[:12]}.yaml").is_file()
    assert torch.load(last, weights_only=True)["config_hash"] == new_hash
