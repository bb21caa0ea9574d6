"""Which checkpoint a command starts from: ``--ckpt_path last`` resolved to a file, or refused in one line."""

from __future__ import annotations

import os
from pathlib import Path

from ..foundation.errors import UsageError
from .identity import RunIdentity

CHECKPOINTS = "checkpoints"
LAST = "last.ckpt"
# --ckpt_path values Lightning resolves itself.
LIGHTNING_KEYWORDS = ("best", "hpc", "registry")


def run_of_checkpoint(path: Path) -> Path | None:
    """The run directory holding a checkpoint file, if the file lies in one (``<run>/checkpoints/``)."""
    if path.parent.name != CHECKPOINTS:
        return None
    # Relative to the working directory when inside it, as the runs' own paths are.
    relative = Path(os.path.relpath(path.parent.parent))
    return path.parent.parent if relative.parts[:1] == ("..",) else relative


def latest_last_checkpoint(experiment: Path, own_run: Path) -> Path | None:
    """``last.ckpt`` of this config's run, else the most recently written one of the experiment."""
    own = own_run / CHECKPOINTS / LAST
    if own.is_file():
        return own
    candidates = sorted(experiment.glob(f"*/{CHECKPOINTS}/{LAST}"), key=lambda path: path.stat().st_mtime)
    return candidates[-1] if candidates else None


def resolve_checkpoint(
    subcommand: str,
    ckpt_path: str | None,
    experiment: Path,
    identity: RunIdentity,
    allow_fresh_start: bool,
) -> Path | str | None:
    """The checkpoint file a command starts from (a Lightning keyword passes through), or a usage error."""
    own_run = identity.run_dir(experiment)
    if ckpt_path is None or ckpt_path in LIGHTNING_KEYWORDS:
        return ckpt_path
    if ckpt_path == "last":
        if subcommand == "fit" and allow_fresh_start:
            # A job script's "resume mine or start it": only this config's own run counts.
            own = own_run / CHECKPOINTS / LAST
            return own if own.is_file() else None
        found = latest_last_checkpoint(experiment, own_run)
        if found is not None:
            return found
        advice = (
            "drop --ckpt_path to start one, or add --allow_fresh_start true to start one when there is none"
            if subcommand == "fit"
            else "train one first (main.py fit with the same --config), or pass the path of a .ckpt file"
        )
        raise UsageError(f"--ckpt_path last: there is no run with a {LAST} under {experiment}; {advice}")
    path = Path(ckpt_path)
    if not path.is_file():
        raise UsageError(
            f"--ckpt_path {ckpt_path}: no such file; give the path of a .ckpt file "
            "(e.g. runs/<name>/<hash>/checkpoints/last.ckpt), or last for the latest run of this config"
        )
    return path
