"""What a stack of configs does to the callbacks list: a later ``trainer.callbacks:`` replaces the list before it.

jsonargparse replaces a list that a later config names again (``trainer.callbacks+:`` appends instead), so a
user's config meant to add one callback silently drops the project's checkpointing, EMA and reports. The command
says which callbacks go, before the run; a whole config that means to replace the list (another dataset's) is
told the same, which is as true for it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml


def callback_names(entries: Any) -> list[str]:
    """The class names of a config's callbacks list (``class_path`` entries or plain import paths)."""
    names = []
    for entry in entries if isinstance(entries, list) else [entries]:
        path = entry.get("class_path") if isinstance(entry, dict) else entry
        if isinstance(path, str):
            names.append(path.rsplit(".", 1)[-1])
    return names


def replaced_callbacks(files: Iterable[os.PathLike | str]) -> list[tuple[str, list[str]]]:
    """Each config (in the order given) whose ``trainer.callbacks`` replaces callbacks the configs before it
    listed, with the names it leaves out. A file that cannot be read is the parser's to report, not this."""
    replaced, listed = [], []
    for file in files:
        try:
            trainer = (yaml.safe_load(Path(os.fspath(file)).read_text()) or {}).get("trainer") or {}
        except (OSError, yaml.YAMLError, AttributeError):
            continue
        if not isinstance(trainer, dict):
            continue
        if "callbacks" in trainer:
            names = callback_names(trainer["callbacks"])
            left_out = [name for name in listed if name not in names]
            if left_out:
                replaced.append((os.fspath(file), left_out))
            listed = names
        if "callbacks+" in trainer:
            listed = [*listed, *callback_names(trainer["callbacks+"])]
    return replaced


def config_files(config: Any) -> list[os.PathLike | str]:
    """A parsed command's config files, in the order jsonargparse applied them: the default, then ``--config``."""
    default = config.get("__default_config__")
    defaults = default if isinstance(default, list) else [default] if default else []
    return [*defaults, *(config.get("config") or [])]


def replaced_callbacks_notes(files: Iterable[os.PathLike | str]) -> list[str]:
    """One line per config whose callbacks list replaces the one before it (what ``replaced_callbacks`` finds)."""
    return [
        f"Note: the trainer.callbacks list of {file} replaces the one before it, so {', '.join(left_out)} "
        f"{'is' if len(left_out) == 1 else 'are'} not used (trainer.callbacks+: adds to a list instead)"
        for file, left_out in replaced_callbacks(files)
    ]
