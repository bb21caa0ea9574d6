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

from classifier_engine.checkpoints.checkpoint_io import AtomicCheckpointIO, read_checkpoint
from classifier_engine.checkpoints.checkpoint_values import SCHEMA_PACKAGES, CheckpointError, settings_to_take
from classifier_engine.cli.trainer_cli import TrainerCLI
from classifier_engine.data.errors import DataSettingError
from classifier_engine.data.image_sources import find_images

from .conftest import (
    PHOTO_ROOT,
    PROJECT_ROOT,
    cli_env,
    default_config,
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


# CI runs the pickle; the plain-data gadgets run on every command in test_checkpoint_fuzz as well
@pytest.mark.parametrize("kind", [pytest.param("plain-data", marks=pytest.mark.slow), "pickle"])
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
            assert "hyper_parameters.optimizer.class_path names os.system" in result.stderr
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


@pytest.mark.slow  # two short fold fits; CI runs the pickle
@pytest.mark.parametrize("kind", ["plain-data", pytest.param("pickle", marks=pytest.mark.every_render)])
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


def test_a_checkpoints_settings_are_taken_as_plain_values_of_their_declared_types(trained, tmp_path):
    """What the schema admits and refuses, key by key, without running a command (the fuzz test runs them)."""
    _, run = trained
    checkpoint = read_checkpoint(run / "checkpoints" / "last.ckpt")
    hparams = checkpoint["hyper_parameters"]
    config = {key: value for key, value in hparams.items() if not key.startswith("_")}
    packages = (*SCHEMA_PACKAGES, "cifar_classifier")

    def take(**changes: object) -> dict:
        return settings_to_take({**hparams, **changes}, config, ImageClassifier, "hyper_parameters", "x.ckpt", packages)

    assert take() == {}  # what the config already says is not taken again
    assert take(label_smoothing=0.2, image_size=64) == {"label_smoothing": 0.2, "image_size": 64}
    assert take(class_names=["os.path", "a/b", "{x: 1}"])["class_names"] == ["os.path", "a/b", "{x: 1}"]  # labels
    width = take(backbone={"class_path": "cifar_classifier.models.backbones.FastCNN", "init_args": {"width": 8}})
    assert width["backbone"].init_args.width == 8  # a class of the project, a plain argument of its type
    refused = {
        "a class spec as a string": {"backbone": "{class_path: subprocess.Popen, init_args: {args: [ls]}}"},
        "a path": {"backbone": str(tmp_path / "evil.yaml")},
        "a URL": {"lr_schedule": "http://127.0.0.1:1/evil.yaml"},
        "a string where a name goes": {"compile_mode": "{class_path: os.system}"},
        "a number where a choice goes": {"task": 3},
        "a boolean where a count goes": {"image_size": True},
        "a class not of a stated package": {"loss": {"class_path": "subprocess.Popen", "init_args": {}}},
        "an untyped argument": {
            "loss": {"class_path": "torch.nn.CrossEntropyLoss", "init_args": {"size_average": "{class_path: x.Y}"}}
        },
        "a class imported into a trusted module": {"backbone": {"class_path": "timm.models._hub.TemporaryDirectory"}},
        "attribute traversal": {"backbone": {"class_path": "torch.nn.functional.os.system"}},
        "look-alike letters": {"backbone": {"class_path": "torch.nn.L\u0456near"}},
        "a function": {"loss": {"class_path": "classifier_engine.foundation.files.sha256"}},
    }
    for what, changes in refused.items():
        with pytest.raises(CheckpointError, match=r"^x\.ckpt: hyper_parameters\.\w+") as error:
            take(**changes)
        assert "--config" in str(error.value) and "\n" not in str(error.value), what


def test_the_bytes_checked_are_the_bytes_restored_and_a_tensor_holds_what_it_claims(trained, tmp_path):
    _, run = trained
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    checkpoint["domain_bank"] = torch.zeros(1, dtype=torch.float16).expand(2**31, 16)  # a few bytes in the file
    torch.save(checkpoint, tmp_path / "zero-stride.ckpt")
    with pytest.raises(CheckpointError, match=r"domain_bank claims a tensor of 2147483648x16 that the file does not"):
        read_checkpoint(tmp_path / "zero-stride.ckpt")
    # The reader Lightning restores through gets the dict the command checked, not the file again.
    writer = AtomicCheckpointIO()
    handed = read_checkpoint(run / "checkpoints" / "last.ckpt")
    writer.hand_over(tmp_path / "gone.ckpt", handed)
    assert writer.load_checkpoint(tmp_path / "gone.ckpt") is handed  # the file does not even exist any more


def test_a_network_a_checkpoint_widens_is_refused_before_it_is_built(trained, tmp_path):
    root, run = trained
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    checkpoint["hyper_parameters"]["backbone"]["init_args"]["width"] = 200_000  # terabytes of weights, a plain int
    torch.save(checkpoint, tmp_path / "wide.ckpt")
    before = tree(root / "runs")
    result = run_cli("predict", "--config", str(run / "config.yaml"), f"--ckpt_path={tmp_path / 'wide.ckpt'}",
                     cwd=root, check=False)  # fmt: skip
    assert result.returncode != 0 and result.stderr.count("\n") == 1, result.stderr[-3000:]
    assert "hyper_parameters.backbone builds a network of" in result.stderr and "MiB of weights" in result.stderr
    assert tree(root / "runs") == before


def test_a_command_reads_its_checkpoint_once(trained, monkeypatch):
    """The bytes checked are the bytes restored: ``validate`` unpickles the file once, and Lightning's restore gets
    that dict (a file replaced between two reads could not slip past the checks)."""
    root, run = trained
    monkeypatch.chdir(root)
    loads = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *args, **kwargs: loads.append(args[0]) or real_load(*args, **kwargs))
    args = ["validate", "--config", str(run / "config.yaml"), f"--ckpt_path={run / 'checkpoints' / 'last.ckpt'}",
            "--trainer.enable_progress_bar=false"]  # fmt: skip
    cli = TrainerCLI(ImageClassifier, default_config=default_config(), args=args)
    assert cli.trainer.state.finished and len(loads) == 1


def test_a_datamodule_class_path_in_a_checkpoint_is_never_imported(trained, tmp_path):
    root, run = trained
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    checkpoint["datamodule_hyper_parameters"]["_class_path"] = "antigravity.Thing"  # importing it opens a browser
    torch.save(checkpoint, tmp_path / "shared.ckpt")
    export = subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "export.py"), "--ckpt_path", str(tmp_path / "shared.ckpt"),
         "--formats", "onnx", "--output_dir", str(tmp_path / "export")],
        cwd=root, capture_output=True, text=True, timeout=300, env=cli_env(),
    )  # fmt: skip
    assert export.returncode != 0 and "datamodule_hyper_parameters._class_path is not" in export.stderr
    assert export.stderr.count("\n") == 1 and not (tmp_path / "export").exists()


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
