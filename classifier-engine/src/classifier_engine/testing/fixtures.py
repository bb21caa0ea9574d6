"""pytest fixtures for a suite that trains on tiny data; a ``conftest.py`` imports the ones it uses.

``from classifier_engine.testing.fixtures import data_dir, fmt, pytest_collection_modifyitems``: ``data_dir``
is a folder holding a tiny CIFAR-10 archive, ``fmt`` runs a test once per CIFAR format, and a ``gpu``-marked
test is skipped, saying why, where no CUDA device is.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ..data.cifar_format import CIFAR10, CIFAR100, CifarFormat
from . import write_tiny_archive


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``gpu``-marked tests run where a CUDA device is; elsewhere they are skipped, saying why."""
    import torch

    if torch.cuda.is_available():
        return
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device (none here)"))


@pytest.fixture(params=[CIFAR10, CIFAR100], ids=lambda fmt: fmt.name)
def fmt(request: pytest.FixtureRequest) -> CifarFormat:
    """Each CIFAR format in turn."""
    return request.param


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A data folder holding a tiny archive of CIFAR-10, as downloaded."""
    write_tiny_archive(tmp_path / "data")
    return tmp_path / "data"
