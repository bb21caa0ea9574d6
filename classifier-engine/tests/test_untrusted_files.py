"""Files from elsewhere are data: a shared checkpoint never runs code, whatever command is given it.

Two checkpoints a stranger could share, each built from a real run's ``last.ckpt``:

- **plain data**: nothing but dicts, strings and tensors (``torch.load(weights_only=True)`` takes it), whose
  ``hyper_parameters.optimizer`` names ``os.system`` with a shell command as its argument;
- **pickle**: a pickled object whose unpickling runs the command.

Every command that takes a checkpoint refuses both in one line, the command never runs (its marker file
never appears), and no checkpoint on disk changes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cifar_classifier.models import ImageClassifier

from classifier_engine.machinery.checkpoint_io import CheckpointError, read_checkpoint
from classifier_engine.machinery.checkpoint_trust import ClassTrust, named_classes

from .conftest import (
    PHOTO_ROOT,
    PROJECT_ROOT,
    cli_env,
    fit_args,
    images_args,
    only_run_dir,
    run_cli,
    tree,
    write_image_folder,
    write_tiny_archive,
)

KINDS = ("plain-data", "pickle")


class RunsACommand:
    """Unpickling this runs ``touch <marker>``: what ``weights_only=False`` would let a file do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return os.system, (f"touch {self.marker}",)


def evil_copy(last: Path, target: Path, kind: str, marker: Path) -> Path:
    """``last`` with a command that touches ``marker`` hidden in it, as ``kind`` says; written to ``target``."""
    checkpoint = torch.load(last, map_location="cpu", weights_only=True)
    if kind == "plain-data":
        checkpoint["hyper_parameters"]["optimizer"] = {
            "class_path": "os.system",
            "init_args": {"command": f"touch {marker}"},
        }
    else:
        checkpoint["hyper_parameters"]["note"] = RunsACommand(marker)
    target.parent.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint, target)
    return target


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    """A folder with a tiny archive and one finished 1-epoch run: (folder, run directory)."""
    root = tmp_path_factory.mktemp("shared")
    write_tiny_archive(root / "data")
    run_cli(*fit_args("data"), cwd=root)
    return root, only_run_dir(root)


def refused_in_one_line(result: subprocess.CompletedProcess, evil: Path, marker: Path) -> None:
    assert result.returncode != 0, result.stdout[-2000:]
    lines = result.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("error: ") and str(evil.name) in lines[-1], result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert not marker.exists(), "the checkpoint ran its command"


@pytest.mark.parametrize("kind", KINDS)
def test_every_command_that_takes_a_checkpoint_refuses_one_that_would_run_code(trained, kind, tmp_path):
    root, run = trained
    marker = tmp_path / "MARKER"
    evil = evil_copy(run / "checkpoints" / "last.ckpt", tmp_path / "shared.ckpt", kind, marker)
    before = tree(root / "runs")
    config = ["--config", str(run / "config.yaml")]
    for subcommand in ("predict", "test", "validate"):
        result = run_cli(subcommand, *config, f"--ckpt_path={evil}", cwd=root, check=False)
        refused_in_one_line(result, evil, marker)
        if kind == "plain-data":
            assert "names os.system at hyper_parameters.optimizer.class_path" in result.stderr
    export = subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "export.py"), "--ckpt_path", str(evil), "--formats", "onnx"],
        cwd=root, capture_output=True, text=True, timeout=300, env=cli_env(),
    )  # fmt: skip
    refused_in_one_line(export, evil, marker)
    assert not (tmp_path / "export").exists()
    # --ckpt_path hpc: Lightning finds the file in the run's folder itself, and reads it through the project's reader.
    hpc = evil_copy(run / "checkpoints" / "last.ckpt", run / "hpc_ckpt_1.ckpt", kind, marker)
    try:
        for subcommand in ("fit", "validate"):
            result = run_cli(subcommand, *config, "--ckpt_path=hpc", cwd=root, check=False)
            refused_in_one_line(result, hpc, marker)
    finally:
        hpc.unlink()
    assert tree(root / "runs") == before  # no checkpoint, config or log of the run changed


@pytest.mark.slow  # two short fold fits
@pytest.mark.every_render
@pytest.mark.parametrize("kind", KINDS)
def test_check_labels_refuses_a_fold_checkpoint_that_would_run_code(tmp_path, kind):
    photos = write_image_folder(tmp_path / "photos", per_class=12)
    command = [
        sys.executable, str(PHOTO_ROOT / "check_labels.py"), *images_args(photos, "--trainer.max_epochs=1")[1:],
        "--folds=2",
    ]  # fmt: skip
    first = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=cli_env())
    assert first.returncode == 0, first.stderr[-3000:]
    marker = tmp_path / "MARKER"
    last = sorted(tmp_path.glob("runs/images/*/checkpoints/last.ckpt"))[0]
    evil_copy(last, last, kind, marker)  # a fold's checkpoint swapped for a shared one
    before = checkpoints(tmp_path)
    again = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=cli_env())
    refused_in_one_line(again, last, marker)
    assert checkpoints(tmp_path) == before  # (the other fold's run, reused first, logs that it was)


def checkpoints(root: Path) -> dict[str, str]:
    return {name: digest for name, digest in tree(root / "runs").items() if name.endswith(".ckpt")}


def test_the_classes_a_checkpoint_names_are_found_wherever_they_hide():
    hparams = {
        "_instantiator": "lightning.pytorch.cli.instantiate_module",
        "optimizer": {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.1}},
        "backbone": {"class_path": "timm.models.resnet.ResNet", "init_args": {"block": "os.system"}},
        "lr_schedule": "subprocess.Popen",  # a bare string where a class is expected is a class path
        "callbacks": [{"class_path": "shutil.rmtree"}],
        "class_names": ["os.path", "cat"],  # labels are data, whatever they look like
        "image_dir": "photos.csv",  # a file, not a module
        "title": "Mr.Smith",
    }
    found = dict(named_classes(hparams, "hyper_parameters"))
    assert found == {
        "hyper_parameters._instantiator": "lightning.pytorch.cli.instantiate_module",
        "hyper_parameters.optimizer.class_path": "torch.optim.SGD",
        "hyper_parameters.backbone.class_path": "timm.models.resnet.ResNet",
        "hyper_parameters.backbone.init_args.block": "os.system",
        "hyper_parameters.lr_schedule": "subprocess.Popen",
        "hyper_parameters.callbacks[0].class_path": "shutil.rmtree",
    }
    trust = ClassTrust().for_project(ClassTrust)
    trusted = {key: trust.trusts(key, name) for key, name in found.items()}
    assert trusted == {
        "hyper_parameters._instantiator": True,
        "hyper_parameters.optimizer.class_path": True,
        "hyper_parameters.backbone.class_path": True,
        "hyper_parameters.backbone.init_args.block": False,
        "hyper_parameters.lr_schedule": False,
        "hyper_parameters.callbacks[0].class_path": False,
    }
    # A function of a trusted package is not a class: jsonargparse would call it with the file's arguments.
    assert not trust.trusts("x.class_path", "classifier_engine.foundation.files.remove_stale_partials")
    assert not trust.trusts("x._instantiator", "os.system")
    assert not trust.trusts("x.class_path", "torch.optimizer_evil.Thing")  # a prefix of a name is not its package
    # What the command's own config names is trusted: the user runs it as a script.
    assert trust.naming({"model": {"optimizer": {"class_path": "subprocess.Popen"}}}).trusts("k", "subprocess.Popen")


def test_a_datamodule_class_path_is_checked_before_it_is_imported(trained, tmp_path):
    _, run = trained
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    checkpoint["datamodule_hyper_parameters"]["_class_path"] = "antigravity.Thing"  # importing it opens a browser
    torch.save(checkpoint, tmp_path / "shared.ckpt")
    with pytest.raises(CheckpointError, match=r"names antigravity\.Thing at datamodule_hyper_parameters\._class_path"):
        read_checkpoint(tmp_path / "shared.ckpt", ClassTrust().for_project(ImageClassifier))
    assert "antigravity" not in sys.modules
