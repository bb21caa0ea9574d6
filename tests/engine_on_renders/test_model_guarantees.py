"""The model contract and the guarantees the CLI installs whatever the model does.

A project's LightningModule is the user's to rewrite; exact resume and calibrated answers must not
depend on what its steps do (``cli/model_guarantees.py``), and a model that lacks part of the
contract (``classifier_engine.ClassifierModel``) is refused in one line before anything is built.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from .conftest import cli_env, fit_args, only_run_dir, write_tiny_archive
from .test_exact_resume import assert_same_run, scalars

SCRIPT = Path(__file__).parent / "support" / "rewritten_model.py"


def run_as(command: str, model: str, *args: str, cwd: Path, env: dict[str, str] | None = None):
    """``python main.py ARGS`` (or ``export.py``) of the CIFAR render with ``model`` as its LightningModule."""
    return subprocess.run(
        [sys.executable, str(SCRIPT), command, model, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=cli_env(**(env or {})),
    )


@pytest.mark.slow
@pytest.mark.every_render  # the template's CI runs it too
def test_steps_rewritten_by_the_user_keep_exact_resume_after_sigterm_and_the_card_s_calibration(tmp_path):
    killable = "--trainer.callbacks+=engine_probes.KillAt"
    args = [*fit_args("data"), "--trainer.max_epochs=2", "--data.batch_size=8", killable]
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    for root in (reference, resumed):
        write_tiny_archive(root / "data")
    finished = run_as("main", "PlainSteps", *args, cwd=reference)
    assert finished.returncode == 0, finished.stderr[-3000:]
    sigterm = {"KILL_AT": "train_batch:1:6", "KILL_SIGNAL": "SIGTERM"}
    stopped = run_as("main", "PlainSteps", *args, cwd=resumed, env=sigterm)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    finished = run_as("main", "PlainSteps", *args, "--ckpt_path=last", cwd=resumed)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert_same_run(reference, resumed)  # weights, optimizer, schedule, loops and every scalar
    logged = scalars(only_run_dir(resumed))
    assert "train/loss_epoch" in logged and "train/top1" not in logged  # a bare loss: no accuracy claimed
    assert {"val/ece", "val/ece_uncalibrated"} <= logged.keys()

    ckpt = only_run_dir(resumed) / "checkpoints" / "last.ckpt"
    calibration = torch.load(ckpt, weights_only=True)["calibration"]
    assert calibration["fitted_on"]["images"] == 32  # the validation split, fitted after the last validation
    assert calibration["temperature"] != [1.0]
    exported = run_as("export", "PlainSteps", "--ckpt_path", str(ckpt), "--data_dir", "data", "--formats", "onnx",
                      cwd=resumed)  # fmt: skip
    assert exported.returncode == 0, exported.stderr[-3000:]
    card = json.loads((ckpt.parent / "export" / "model.card.json").read_text())
    assert card["calibration"]["temperature"] == calibration["temperature"]
    assert card["calibration"]["fitted_on"]["images"] == 32
