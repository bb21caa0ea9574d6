"""The model to ship and the data that judges it, built for a checkpoint (or a one-line reason why they cannot be).

A checkpoint is data (``checkpoint_values``): it is read once, and the model and its DataModule are built from
the project's code and the config the user runs (``--config``, else the project's default), with the settings
the checkpoint may give taken as plain values. Nothing of it reaches ``load_from_checkpoint`` or a parser.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import lightning as L

from ..checkpoints.checkpoint_io import read_checkpoint
from ..checkpoints.checkpoint_values import check_fits
from ..contract import ClassifierModel, check_model
from ..foundation.errors import UserError, parse_error_line
from .errors import ExportError

# Building the model writes nothing and starts nothing: no logger, one CPU process.
ON_THIS_PROCESS = (
    "--trainer.logger=false",
    "--trainer.accelerator=cpu",
    "--trainer.devices=1",
    "--trainer.num_nodes=1",
    "--trainer.strategy=auto",
)


@contextmanager
def quiet_lightning() -> Iterator[None]:
    """Without the lines Lightning prints as it builds a trainer (the seed, the accelerators): no trainer runs here."""
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


@dataclass(frozen=True)
class LoadedModel:
    """A checkpoint's model in eval mode, the DataModule built with it (not yet set up), and the dict read."""

    model: ClassifierModel
    datamodule: L.LightningDataModule | None
    checkpoint: dict


def load_model(
    ckpt_path: Path, model_class: type, default_config: Path | None, config_args: Sequence[str] = ()
) -> LoadedModel:
    """The project's ``model_class`` built from the config with the checkpoint's admitted settings, its weights in.

    ``config_args``: the command line's ``--config`` files and options (the project's default config first).
    """
    from ..cli.trainer_cli import TrainerCLI  # the CLI's parser builds the model exactly as main.py does

    if not ckpt_path.is_file():
        problem = "is a folder" if ckpt_path.is_dir() else "does not exist"
        raise ExportError(f"checkpoint {ckpt_path} {problem}; pass the path of a .ckpt file with --ckpt_path")
    try:
        checkpoint = read_checkpoint(ckpt_path)
        with quiet_lightning():
            cli = TrainerCLI(
                model_class,
                default_config=default_config,
                checkpoint=(ckpt_path, checkpoint),
                run=False,
                args=[*config_args, *ON_THIS_PROCESS],
            )
        model = cli.model
        check_fits(checkpoint, model, ckpt_path)
        model.load_state_dict(checkpoint["state_dict"])
    except UserError as error:
        raise ExportError(str(error)) from error
    except (RuntimeError, ValueError, TypeError) as error:  # a checkpoint of another model fails in many ways
        reason = parse_error_line(str(error))
        raise ExportError(f"{ckpt_path} does not rebuild a {model_class.__name__}: {reason}") from error
    check_model(model)
    # The calibration fitted in training (the CLI's CalibrationFit callback restores it; here no trainer runs).
    model.calibration.restore_from(checkpoint)
    return LoadedModel(model.eval(), cli.datamodule, checkpoint)
