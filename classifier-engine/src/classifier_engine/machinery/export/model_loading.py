"""The model to ship, rebuilt from a checkpoint (or a one-line reason why it cannot be)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ...contract import ClassifierModel, check_model
from ...foundation.errors import parse_error_line
from ..checkpoint_io import CheckpointError, read_checkpoint
from ..checkpoint_trust import ClassTrust
from .errors import ExportError


def load_model(ckpt_path: Path, model_class: type, trusted: Iterable[str] = ()) -> tuple[ClassifierModel, dict]:
    """The project's ``model_class`` rebuilt from the checkpoint's hyperparameters, in eval mode, and the checkpoint.

    Nothing is built before the file is read and checked: a class it names must be the project's, of a stated
    package (``checkpoint_trust``), or one of ``trusted`` (``--trust``).
    """
    if not ckpt_path.is_file():
        problem = "is a folder" if ckpt_path.is_dir() else "does not exist"
        raise ExportError(f"checkpoint {ckpt_path} {problem}; pass the path of a .ckpt file with --ckpt_path")
    try:
        trust = ClassTrust().for_project(model_class).naming(classes=trusted, named_by="--trust")
        checkpoint = read_checkpoint(ckpt_path, trust, "pass --trust with the class if you trust it")
    except CheckpointError as error:
        raise ExportError(str(error)) from error
    try:
        model = model_class.load_from_checkpoint(ckpt_path, map_location="cpu")
    except Exception as error:  # a checkpoint of another model fails in many ways
        # One line; e.g. "model.backbone: No module named 'my_nets'" for a network that is not importable here.
        reason = parse_error_line(str(error)).replace("module.", "model.", 1)
        raise ExportError(f"{ckpt_path} does not rebuild a {model_class.__name__}: {reason}") from error
    check_model(model)
    # The calibration fitted in training (the CLI's CalibrationFit callback restores it; here no trainer runs).
    model.calibration.restore_from(checkpoint)
    return model.eval(), checkpoint
