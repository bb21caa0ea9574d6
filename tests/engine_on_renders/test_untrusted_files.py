"""Files from elsewhere are data: a shared checkpoint never runs code, and an image list reaches only its folder.

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

from classifier_engine.data.errors import DataSettingError
from classifier_engine.data.image_sources import find_images
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


def list_reaching_outside(root: Path, how: str) -> Path:
    """``root/photos/list.csv`` over photos in it, with one row naming a photo outside its folder, as ``how`` says."""
    photos = write_image_folder(root / "photos", ("cat", "dog"), per_class=8)
    secret = write_image_folder(root / "secret", ("cat",), per_class=1) / "cat"
    private = next(secret.iterdir())
    outside = {
        "dotdot": f"../secret/cat/{private.name}",
        "absolute": str(private),
        "symlink": "cat/linked" + private.suffix,
    }[how]
    if how == "symlink":
        (photos / "cat" / f"linked{private.suffix}").symlink_to(private)
    rows = [f"{path.relative_to(photos).as_posix()},{path.parent.name}" for path in sorted(photos.rglob("*.*"))
            if not path.is_symlink()]  # fmt: skip
    csv_path = photos / "list.csv"
    csv_path.write_text("path,label\n" + "\n".join([*rows[:3], f"{outside},cat", *rows[3:]]) + "\n")
    return csv_path


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_an_image_list_cannot_reach_outside_its_folder(tmp_path, how):
    csv_path = list_reaching_outside(tmp_path, how)
    with pytest.raises(DataSettingError, match=r"row 4 names .*, which lies outside photos/, the list's folder") as no:
        find_images(csv_path)
    assert "data.allow_paths_outside true" in str(no.value) and "\n" not in str(no.value)
    admitted = find_images(csv_path, allow_outside=True)
    assert len(admitted.splits["train"]) == 17


def test_a_list_outside_its_folder_is_refused_by_fit_and_admitted_when_allowed(tmp_path):
    csv_path = list_reaching_outside(tmp_path, "dotdot")
    before = tree(tmp_path)
    refused = run_cli(*images_args(csv_path, "--trainer.max_epochs=1"), cwd=tmp_path, check=False)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert refused.stderr.startswith(f"error: data.image_dir={csv_path} row 4 names ../secret/cat/")
    assert tree(tmp_path) == before  # nothing packed, no run
    run_cli(*images_args(csv_path, "--trainer.max_epochs=1", "--data.allow_paths_outside=true"), cwd=tmp_path)
    config = (only_run_dir(tmp_path) / "config.yaml").read_text()
    assert "allow_paths_outside: true" in config  # the run's identity records it
