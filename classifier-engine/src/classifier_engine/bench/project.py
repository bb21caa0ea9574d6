"""The project a benchmark measures: the rendered project in the current folder (or ``BENCH_PROJECT``).

Its ``main.py`` names the LightningModule and the default config; its package holds the networks and the
DataModule. Run a benchmark from the project's folder: ``python -m classifier_engine.bench step``.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(os.environ.get("BENCH_PROJECT", Path.cwd())).resolve()
for _path in (PROJECT_ROOT / "src", PROJECT_ROOT):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import main as _project_main

ImageClassifier = _project_main.ImageClassifier
DEFAULT_CONFIG: Path = _project_main.DEFAULT_CONFIG
PACKAGE = ImageClassifier.__module__.split(".")[0]


def project_class(dotted: str) -> Any:
    """A class of the project's package, e.g. ``project_class("data.CifarDataModule")``."""
    module, name = dotted.rsplit(".", 1)
    return getattr(importlib.import_module(f"{PACKAGE}.{module}"), name)
