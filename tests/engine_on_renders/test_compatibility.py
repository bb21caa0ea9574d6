"""A run written by an earlier release of classifier-engine resumes, extends and exports under this one.

Semantic versioning's promise for a minor release, checked on real run folders (config, hash and
``last.ckpt`` of a one-epoch fit of the CIFAR render) written by classifier-engine 1.0.0, 1.1.0 and 1.2.0:
the same command finds the same run, a longer ``max_epochs`` continues it from its step, and ``export.py``
ships it (the oldest release's: once extended, each run's ``last.ckpt`` is written by this release).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import torch

from classifier_engine.data.preprocessing import CHECKPOINT_KEY, Preprocessing

from .conftest import NUM_TEST, PROJECT_ROOT, cli_env, fit_args, run_cli, write_tiny_archive

FIXTURES = Path(__file__).parent / "fixtures"
RELEASES = ("1.0.0", "1.1.0", "1.2.0")
PREVIOUS_RELEASES = {release: FIXTURES / f"run-written-by-{release}.tar.gz" for release in RELEASES}


def test_a_run_of_the_previous_release_resumes_extends_and_exports(tmp_path):
    for release, archive in PREVIOUS_RELEASES.items():
        root = tmp_path / release
        with tarfile.open(archive) as runs:
            runs.extractall(root, filter="data")
        write_tiny_archive(root / "data")  # the same tiny archive the run was trained on
        (run_dir,) = (path.parent for path in root.glob("runs/cifar10/*/config.yaml"))
        last = run_dir / "checkpoints" / "last.ckpt"
        assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 10

        finished = run_cli(*fit_args("data", "--ckpt_path=last"), cwd=root)  # the same command: the same run, done
        assert "Nothing left to train: the run had already reached" in finished.stdout + finished.stderr
        extended = run_cli(
            *fit_args("data", "--trainer.max_epochs=2", "--ckpt_path=last", "--allow_config_change=true"), cwd=root
        )
        assert "`Trainer.fit` stopped: `max_epochs=2` reached." in extended.stdout + extended.stderr
        assert [path.parent for path in root.glob("runs/cifar10/*/config.yaml")] == [run_dir], release
        assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 20, release
        if release != RELEASES[0]:
            continue  # once extended, every release's last.ckpt is this release's: the oldest run's export suffices
        export = [sys.executable, str(PROJECT_ROOT / "export.py"), "--ckpt_path", str(last), "--formats", "onnx"]
        shipped = subprocess.run(export, cwd=root, capture_output=True, text=True, timeout=300, env=cli_env())
        assert shipped.returncode == 0, shipped.stderr[-3000:]
        card = json.loads((last.parent / "export" / "model.card.json").read_text())
        assert card["source"]["global_step"] == 20 and card["evaluation"]["images"] == NUM_TEST
        # The preprocessing record (new in 1.1): the resumed run's checkpoints carry it, as the card does.
        record = torch.load(last, map_location="cpu", weights_only=False)["preprocessing"]
        assert record == card["input"]["preprocessing"]
        assert record["image_size"] == 32 and record["resize"] == "stretch" and len(record["mean"]) == 3
        # The calibration (new in 1.2): fitted by the extending run's validation, kept by its checkpoint, in the card.
        calibration = torch.load(last, map_location="cpu", weights_only=False)["calibration"]
        assert card["calibration"]["temperature"] == calibration["temperature"] and card["task"] == "multiclass"


def test_a_checkpoint_without_the_preprocessing_record_reads_the_same_from_its_settings(tmp_path):
    with tarfile.open(PREVIOUS_RELEASES["1.0.0"]) as runs:
        runs.extractall(tmp_path, filter="data")
    (last,) = tmp_path.glob("runs/cifar10/*/checkpoints/last.ckpt")
    checkpoint = torch.load(last, map_location="cpu", weights_only=False)
    assert CHECKPOINT_KEY not in checkpoint  # written by 1.0.0
    record = Preprocessing.of_checkpoint(checkpoint)
    model = checkpoint["hyper_parameters"]
    assert record == Preprocessing(32, "stretch", "bilinear", 1.0, tuple(model["mean"]), tuple(model["std"]))
    assert record.resize_rule() == "each side scaled to 32 px (bilinear, antialiased)"
