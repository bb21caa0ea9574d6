"""The project's data on a tiny generated set, and the commands run as a user types them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

{% if cookiecutter.dataset == 'images' -%}
from classifier_engine.testing import write_image_folder

from {{ cookiecutter.import_name }}.data import PhotoDataModule
{%- else -%}
from classifier_engine import CIFAR_FORMATS
from classifier_engine.testing import write_tiny_archive

from {{ cookiecutter.import_name }}.data import CifarDataModule
{%- endif %}

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = PROJECT_ROOT / "configs" / "{{ cookiecutter.dataset }}.yaml"
{%- if cookiecutter.dataset == 'images' %}
# From scratch and a tiny network at 32 px: the commands are under test here, not the fine-tune.
TINY_ARGS = [
    "--config", str(PROJECT_ROOT / "configs" / "presets" / "from_scratch.yaml"),
    "--data.image_size=32", "--data.val_fraction=0.25", "--data.test_fraction=0.25", "--data.batch_size=8",
    "--data.num_workers=0", "--data.pack_workers=1",
    "--model.backbone=FastCNN", "--model.backbone.width=4",
    "--trainer.accelerator=cpu", "--trainer.log_every_n_steps=1", "--trainer.enable_progress_bar=false",
]  # fmt: skip


def write_data(root: Path) -> list[str]:
    """A folder of photos under ``root``; the options that point ``fit`` at it."""
    write_image_folder(root / "photos", per_class=12)
    return [f"--data.image_dir={root / 'photos'}", f"--data.cache_dir={root / 'packed'}"]


@pytest.fixture
def project_data(tmp_path: Path) -> PhotoDataModule:
    """The project's DataModule on a tiny folder of photos (10 batches of 16 an epoch), prepared and set up for fit."""
    write_image_folder(tmp_path / "photos", per_class=72)
    data = PhotoDataModule(
        image_dir=str(tmp_path / "photos"), cache_dir=str(tmp_path / "packed"), image_size=32, val_fraction=0.25,
        num_workers=0, pack_workers=1, batch_size=16,
    )  # fmt: skip
    data.prepare_data()
    data.setup("fit")
    return data
{%- else %}
# A tiny network: the commands are under test here, not the recipe.
TINY_ARGS = [
    "--data.verify_checksum=false", "--data.val_size=32", "--data.batch_size=16", "--data.num_workers=0",
    "--model.backbone=FastCNN", "--model.backbone.width=4",
    "--trainer.accelerator=cpu", "--trainer.log_every_n_steps=1", "--trainer.enable_progress_bar=false",
]  # fmt: skip


def write_data(root: Path) -> list[str]:
    """A tiny archive in CIFAR's official format under ``root``; the options that point ``fit`` at it."""
    write_tiny_archive(root / "data", CIFAR_FORMATS["{{ cookiecutter.dataset }}"])
    return [f"--data.data_dir={root / 'data'}"]


@pytest.fixture
def project_data(tmp_path: Path) -> CifarDataModule:
    """The project's DataModule on a tiny archive in CIFAR's official format, prepared and set up for fit."""
    write_tiny_archive(tmp_path / "data", CIFAR_FORMATS["{{ cookiecutter.dataset }}"])
    data = CifarDataModule(data_dir=str(tmp_path / "data"), verify_checksum=False, num_workers=0, batch_size=16,
                           val_size=32)  # fmt: skip
    data.prepare_data()
    data.setup("fit")
    return data
{%- endif %}


def run_command(
    script: str, *args: str, cwd: Path, timeout: float = 300, **popen: object
) -> subprocess.CompletedProcess:
    """``python <script> ARGS`` in ``cwd``, as typed in a shell; it must succeed."""
    command = [sys.executable, str(PROJECT_ROOT / script), *args]
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, **popen)
    assert result.returncode == 0, f"{script} {' '.join(args)} exited {result.returncode}:\n{result.stderr[-4000:]}"
    return result
