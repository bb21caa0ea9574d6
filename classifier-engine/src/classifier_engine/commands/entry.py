"""One way into every command: ``run_<command>(ModelClass, DEFAULT_CONFIG)``, called by the project's entry script.

``ModelClass`` is the project's LightningModule and ``DEFAULT_CONFIG`` the YAML every command starts
from (``configs/<dataset>.yaml``); each function parses ``sys.argv``, prints a mistake as one
``error:`` line, and exits with the command's status.
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning as L


def run_main(model_class: type[L.LightningModule], default_config: Path) -> None:
    """``python main.py {fit,validate,test,predict} ...``: train and evaluate (LightningCLI)."""
    from ..cli.trainer_cli import main

    main(model_class, default_config)


def run_export(model_class: type[L.LightningModule], default_config: Path) -> None:
    """``python export.py --ckpt_path ...``: deployable files judged on the held-out split, with a model card.

    MLflow's experiment for ``--register`` of an untracked run is the project's folder name.
    """
    from . import export

    sys.exit(export.main(model_class, project_name(default_config), default_config=default_config))


def run_sweep(model_class: type[L.LightningModule], default_config: Path) -> None:
    """``python sweep.py --sweep configs/sweeps/...yaml``: an Optuna search whose trials are ``fit`` runs."""
    from . import sweep

    sweep.run(model_class, default_config)


def run_check_labels(model_class: type[L.LightningModule], default_config: Path) -> None:
    """``python check_labels.py ...``: out-of-sample probabilities over k folds, suspect labels ranked by cleanlab."""
    from . import check_labels

    check_labels.run(model_class, default_config)


def run_cross_validate(model_class: type[L.LightningModule], default_config: Path) -> None:
    """``python cross_validate.py ...``: k fold runs, each figure with its spread, out-of-fold answers, a report."""
    from . import cross_validate

    cross_validate.run(model_class, default_config)


def run_pack(model_class: type[L.LightningModule], default_config: Path) -> None:
    """``python pack.py --output ...``: the project's images packed by litdata, through its DataModule and config."""
    from ..cli import pack_command

    pack_command.main(model_class, default_config)


def project_name(default_config: Path) -> str:
    """The project's folder: the one holding ``configs/``."""
    return Path(default_config).resolve().parent.parent.name
