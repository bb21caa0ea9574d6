"""A DataModule of your own gets every command: fit, test, predict, and an export judged on its own held-out split.

The DataModule is the one ``docs/data_and_speed.md`` shows, taken from the page itself, so the
example stays true; the second is a subclass of ``ImageFolderDataModule``. ``export.py`` rebuilds
each from its checkpoint alone.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch

from .conftest import PROJECT_ROOT, cli_env, images_args, project_of, run_cli, write_image_folder
from .test_export import top_k_correct

pytestmark = [
    pytest.mark.slow,  # five process starts each
    # mlflow's SQL store and its dependencies warn about their own deprecations
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]
DOCS = PROJECT_ROOT / "docs" / "data_and_speed.md"
TINY = [
    "--data.batch_size=16",
    "--data.num_workers=0",
    "--model.backbone=cifar_classifier.models.backbones.FastCNN",
    "--model.backbone.width=4",
    "--trainer.accelerator=cpu",
    "--trainer.max_epochs=1",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]


def docs_block(language: str, first_line: str) -> str:
    """The fenced ``language`` block of docs/data_and_speed.md that starts with ``first_line``."""
    for block in re.findall(rf"```{language}\n(.*?)```", DOCS.read_text(), flags=re.DOTALL):
        if block.startswith(first_line):
            return block
    raise AssertionError(f"docs/data_and_speed.md has no {language} block starting with {first_line!r}")


def write_arrays(root: Path, seed: int = 0) -> None:
    """train_x/train_y/test_x/test_y.npy as the example reads them: dark and light images, two classes."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True)
    for split, count in (("train", 160), ("test", 48)):
        labels = rng.integers(0, 2, count)
        images = labels[:, None, None, None] * 150 + 50 + rng.integers(-40, 41, (count, 3, 32, 32))
        np.save(root / f"{split}_x.npy", np.clip(images, 0, 255).astype(np.uint8))
        np.save(root / f"{split}_y.npy", labels.astype(np.int64))


def env_with(folder: Path) -> dict[str, str]:
    """The CLI's environment with ``folder`` importable, as a user's own module is."""
    return {"PYTHONPATH": f"{os.environ['PYTHONPATH']}{os.pathsep}{folder}"}


def export(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(project_of(args, cwd) / "export.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env=cli_env(**env),
    )


def onnx_counts(path: Path, images: np.ndarray, labels: np.ndarray) -> tuple[int, int]:
    """Correct top-1 and top-5 counts of an ONNX file, computed here with onnxruntime alone."""
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return top_k_correct(session.run(None, {"images": images})[0], labels)


def check_card(folder: Path, images: np.ndarray, labels: np.ndarray, split: str) -> dict:
    """Every ONNX file judged on exactly ``images``: the card's counts are onnxruntime's own."""
    card = json.loads((folder / "model.card.json").read_text())
    assert card["evaluation"]["split"] == split
    assert card["evaluation"]["images"] == card["evaluation"]["split_images"] == len(labels)
    for name, file in (("onnx", "model.onnx"), ("int8", "model.int8.onnx")):
        accuracy = card["artifacts"][name]["accuracy"]
        assert (accuracy["top1_correct"], accuracy["top5_correct"]) == onnx_counts(folder / file, images, labels)
    assert card["int8"]["calibration"]["images"] > 0 and (folder / "model.pt2").is_file()
    return card


def fit_test_predict(fit: list[str], cwd: Path, env: dict[str, str]) -> Path:
    """fit, then test and predict from the run's config; returns the run folder."""
    run_cli(*fit, cwd=cwd, env=env)
    (run,) = (path.parent for path in cwd.glob("runs/*/*/config.yaml"))
    for subcommand in ("test", "predict"):
        result = run_cli(subcommand, "--config", str(run / "config.yaml"), "--ckpt_path=last", cwd=cwd, env=env)
        assert result.returncode == 0
    (predictions,) = run.glob("predict/*/predictions.csv")
    assert len(predictions.read_text().splitlines()) > 1
    return run


# The promise holds whatever the render's default dataset; the full tier (-m slow) only: CI's time.
def test_the_docs_datamodule_gets_test_predict_export_int8_and_the_registry(tmp_path):
    (tmp_path / "my_data.py").write_text(docs_block("python", "# my_data.py"))
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "my_data.yaml").write_text(docs_block("yaml", "# configs/my_data.yaml"))
    write_arrays(tmp_path / "data" / "arrays")
    env = env_with(tmp_path)
    config = PROJECT_ROOT / "configs" / "cifar10.yaml"
    fit = ["fit", "--config", str(config), "--config", "configs/my_data.yaml", "--data.val_size=32", *TINY]
    run = fit_test_predict(fit, tmp_path, env)

    # A checkpoint is data: the DataModule is the config's, so the run's own config (code the user runs) is passed.
    trust = ["--config", str(run / "config.yaml")]
    refused = export("--ckpt_path", str(run / "checkpoints" / "last.ckpt"), cwd=tmp_path, env=env)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "datamodule_hyper_parameters._class_path is not cifar_classifier.data.CifarDataModule" in refused.stderr
    assert "pass the run's own config.yaml with --config" in refused.stderr
    assert not (run / "checkpoints" / "export").exists()
    result = export("--ckpt_path", str(run / "checkpoints" / "last.ckpt"), "--max_int8_drop=100", *trust,
                    "--register", "own-arrays", cwd=tmp_path, env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    images, labels = np.load(tmp_path / "data/arrays/test_x.npy"), np.load(tmp_path / "data/arrays/test_y.npy")
    card = check_card(run / "checkpoints" / "export", images, labels, "test")
    assert card["evaluation"]["dataset"] == "arrays in data/arrays" and card["class_names"] == ["dark", "light"]
    assert "registered own-arrays version 1" in result.stdout
    assert "registered own-arrays-int8 version 1" in result.stdout

    # --data_dir reaches the DataModule's own use_data_dir: the same arrays, moved.
    (tmp_path / "data" / "arrays").rename(tmp_path / "moved")
    moved = export("--ckpt_path", str(run / "checkpoints" / "last.ckpt"), "--max_int8_drop=100", *trust,
                   "--data_dir", str(tmp_path / "moved"), "--output_dir", str(tmp_path / "again"),
                   cwd=tmp_path, env=env)  # fmt: skip
    assert moved.returncode == 0, moved.stderr[-3000:]
    check_card(tmp_path / "again", images, labels, "test")


FOLDER_SUBCLASS = '''
from classifier_engine.data import ImageFolderDataModule


class TaggedPhotos(ImageFolderDataModule):
    """A folder DataModule of a user's: its own title, the packing and the split inherited."""

    def __init__(self, tag: str = "mine", **kwargs) -> None:
        super().__init__(**kwargs)
        self.title = f"{tag} photos of {self.image_dir}"
'''


# About a minute: in the slow tier only (the module's `slow`, without `every_render`).
def test_a_folder_datamodule_subclass_exports_from_its_packed_copy_without_data_dir(tmp_path):
    (tmp_path / "my_photos.py").write_text(FOLDER_SUBCLASS)
    photos = write_image_folder(tmp_path / "photos", per_class=16)
    env = env_with(tmp_path)
    own_network = [arg.replace("cifar_classifier.", "photo_classifier.") for arg in TINY]  # the render's own
    fit = [*images_args(photos, "--data=my_photos.TaggedPhotos", "--data.tag=ours", "--data.test_fraction=0.25"),
           *own_network]  # fmt: skip
    run = fit_test_predict(fit, tmp_path, env)

    # The export reads the packed copy the checkpoint names (by its folder's name, under the config's cache folder)
    # and the held-out rows it records: the photos may be gone.
    photos.rename(tmp_path / "elsewhere")
    result = export("--ckpt_path", str(run / "checkpoints" / "last.ckpt"), "--max_int8_drop=100",
                    "--config", str(run / "config.yaml"), "--register", "own-photos",
                    "--tracking_uri", f"sqlite:///{tmp_path / 'mlflow.db'}", cwd=tmp_path, env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "registered own-photos version 1" in result.stdout
    (packed,) = (path for path in (tmp_path / "data" / "packed").iterdir() if path.is_dir())
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["TaggedPhotos"]
    rows = state["held_out_rows"]["test"].numpy()
    images, labels = np.load(packed / "train_images.npy")[rows], np.load(packed / "train_labels.npy")[rows]
    card = check_card(run / "checkpoints" / "export", images, labels, "test")
    assert card["evaluation"]["dataset"].startswith("ours photos of") and card["evaluation"]["data_dir"] == packed.name
