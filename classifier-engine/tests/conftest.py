"""The library's own tests: no project is needed.

Where a test runs a command, the model is ``classifier_engine.testing.reference``: the smallest
LightningModule that keeps the ``ClassifierModel`` contract, over the library's ``ImageFolderDataModule``.
The engine's tests with the template's renders (their models, recipes and configs) live with the template.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from classifier_engine.data.cifar_format import FORMATS
from classifier_engine.testing import (  # noqa: F401  (for the tests)
    NUM_TEST,
    NUM_TRAIN,
    make_images,
    write_image_folder,
    write_tiny_archive,
)

# data_dir, fmt, and gpu-marked tests skipped where no CUDA device is
pytest_plugins = ["classifier_engine.testing.fixtures"]
HERE = Path(__file__).resolve().parent
DATASET = FORMATS["cifar10"]


def cli_env(**extra: str) -> dict[str, str]:
    """The environment for command subprocesses: ``probes`` (this folder) importable, plus ``extra``."""
    path = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, "PYTHONPATH": path, **extra}


def reference(
    *args: str, cwd: Path, check: bool = True, env: dict[str, str] | None = None, script: str | None = None
) -> subprocess.CompletedProcess:
    """``python -m classifier_engine.testing.reference ARGS`` in ``cwd``: a project's ``main.py ARGS``.

    ``export ...`` is its ``export.py``; ``script`` runs a file of this folder instead (a model of ``probes``).
    """
    command = [str(HERE / script)] if script else ["-m", "classifier_engine.testing.reference"]
    result = subprocess.run(
        [sys.executable, *command, *args], cwd=cwd, capture_output=True, text=True, timeout=300,
        env=cli_env(**(env or {})),
    )  # fmt: skip
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {result.returncode}:\n{result.stderr[-4000:]}")
    return result


def tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` with the SHA-256 of its bytes, and every folder (an empty one is a leftover too)."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "folder"
        for path in sorted(root.rglob("*"))
    }


def only_run_dir(root: Path) -> Path:
    """The one run directory under ``root/runs`` (a second one would mean a run went astray)."""
    runs = [p.parent for p in root.glob("runs/*/*/config.yaml")]
    assert len(runs) == 1, runs
    return runs[0]


FIT = ["fit", "--data.image_dir=photos", "--trainer.callbacks+=probes.SignalAt"]


@pytest.fixture(scope="session")
def trained(tmp_path_factory) -> Path:
    """A folder of 72 photos of 3 classes and one finished 2-epoch fit of the reference model on them."""
    root = tmp_path_factory.mktemp("reference")
    write_image_folder(root / "photos")
    reference(*FIT, cwd=root)
    return root
