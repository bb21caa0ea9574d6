"""The README's main job, ``scripts/train.sh``, as on a fresh machine: its own venv, render, lock install, train."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from .conftest import copy_template

pytestmark = pytest.mark.slow

TINY_RUN = [
    "--data.verify_checksum=false", "--data.val_size=32", "--data.batch_size=32", "--data.num_workers=0",
    "--trainer.max_epochs=1", "--trainer.accelerator=cpu", "--model.backbone.width=8",
]  # fmt: skip
PACK = """
import sys, numpy as np
sys.path.insert(0, sys.argv[2])  # the rendered project: its tests write official-format archives
from classifier_engine.data.cifar_format import CIFAR10
from classifier_engine.testing.cifar_archives import write_archive
rng = np.random.default_rng(0)
x = rng.integers(0, 256, (160, 3, 32, 32), dtype=np.uint8)
y = rng.integers(0, 10, 160)
write_archive(sys.argv[1] + "/" + CIFAR10.archive_name, CIFAR10, x[:128], y[:128], x[128:], y[128:])
"""


def train_sh(template: Path, data_dir: Path, *args: str) -> subprocess.CompletedProcess:
    config = template.parent / "cookiecutterrc.yaml"  # isolated from the user's cookiecutter settings
    config.write_text(f"cookiecutters_dir: {template.parent / 'clones'}\nreplay_dir: {template.parent / 'replay'}\n")
    env = {**os.environ, "DATA_DIR": str(data_dir), "COOKIECUTTER_CONFIG": str(config)}
    env.pop("VIRTUAL_ENV", None)
    command = ["bash", str(template / "scripts" / "train.sh"), *args]
    return subprocess.run(command, cwd=template.parent, capture_output=True, text=True, timeout=1500, env=env)


def test_the_main_job_renders_installs_and_trains(tmp_path):
    template = copy_template(tmp_path / "template")
    data_dir = tmp_path / "data"
    data_dir.mkdir()

    # No archive and no download allowed: the job builds everything, then stops in one line.
    missing = train_sh(template, data_dir, "--data.download=false")
    errors = [line for line in missing.stderr.splitlines() if line.startswith("error: ")]
    assert missing.returncode == 1 and len(errors) == 1 and str(data_dir) in errors[0], missing.stderr[-3000:]
    project, python = template / "build" / "cifar-classifier", template / "build" / ".venv" / "bin" / "python"
    assert not (project / "runs").exists()

    # The archive in place (written by the rendered project's tests' packer): the same command trains.
    subprocess.run([str(python), "-c", PACK, str(data_dir), str(project)], check=True, timeout=300)
    trained = train_sh(template, data_dir, *TINY_RUN)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "`Trainer.fit` stopped: `max_epochs=1` reached." in trained.stdout + trained.stderr
    assert len(list((project / "runs" / "cifar10").glob("*/checkpoints/last.ckpt"))) == 1
    assert "Run: runs/cifar10/" in trained.stdout
    installed = subprocess.run([str(python), "-m", "pip", "freeze"], capture_output=True, text=True, check=True).stdout
    locked = {line.split(" ;")[0] for line in (project / "constraints.txt").read_text().splitlines() if "==" in line}
    assert "torch==2.14.1" in installed.splitlines()
    assert {line for line in installed.splitlines() if line.startswith(("lightning==", "torchmetrics=="))} <= locked
