"""A run's folder: where one command's logs and checkpoints go, holding it, and undoing a start that failed.

- **Placing.** The run directory is ``<logger save_dir>/<logger name>/<short hash>/`` (``identity.py``);
  the loggers and checkpoint writers are pointed at it before they are built.
- **Deciding.** ``Run.plan`` refuses, before a file is written, a resume that would change the config
  without ``--allow_config_change`` (or at all, for settings that shape the weights), and a fresh
  start over a run that already has checkpoints (which checkpoint ``last`` means: ``resolution.py``).
- **Holding.** One process trains a run at a time (``run_lock.py``).
- **Failing.** A session that fails before its first optimizer step leaves the disk as it was.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import MLFlowLogger, WandbLogger

from ..checkpoints.checkpoint_values import HOW_TO_TRUST, CheckpointError
from ..foundation.errors import UsageError
from ..foundation.files import NewFolders
from .config_hash import LAUNCH_SWITCHES
from .identity import RunIdentity, describe, shapes_weights
from .loggers import DIRECTORY_LOGGERS, callbacks, class_of, is_directory_logger, loggers
from .resolution import CHECKPOINTS, run_of_checkpoint
from .run_lock import RunLock
from .session import Session

HASH_FILENAME = "config_hash.txt"
# Files a session may rewrite in an existing run directory, restored if it fails before training.
SMALL_FILE_BYTES = 1 << 20


@dataclass
class Run:
    """Where one command's logs and checkpoints go, and what it continues."""

    subcommand: str
    identity: RunIdentity
    directory: Path
    checkpoint: Path | str | None = None
    session: Session = field(default_factory=Session)
    # What ``take`` found and holds.
    _new_folders: NewFolders | None = field(default=None, init=False, repr=False)
    _before: dict[Path, bytes | None] = field(default_factory=dict, init=False, repr=False)
    _lock: RunLock | None = field(default=None, init=False, repr=False)
    # The placement keys as given, before ``place`` pointed them at this run.
    _given: dict[str | tuple[str, int, str], Any] = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def plan(
        cls,
        subcommand: str,
        identity: RunIdentity,
        experiment: Path,
        checkpoint: Path | str | None,
        stored: dict[str, Any],
        allow_config_change: bool,
    ) -> Run:
        """Decide the run directory, or refuse (before anything is written) with what to do instead."""
        own = identity.run_dir(experiment)
        checkpoint_run = run_of_checkpoint(checkpoint) if isinstance(checkpoint, Path) else None
        if subcommand != "fit":
            # Evaluating a run's checkpoint logs inside that run: <run>/<subcommand>/<hash>/.
            directory = identity.run_dir(checkpoint_run / subcommand) if checkpoint_run else own
            return cls(subcommand, identity, directory, checkpoint)
        if isinstance(checkpoint, Path) and stored.get("config_hash") not in (None, identity.hash):
            changes = identity.changes_from(recorded_config(stored, checkpoint))
            source = checkpoint_run or checkpoint
            fixed = {key: change for key, change in changes.items() if shapes_weights(key)}
            if fixed:
                raise UsageError(
                    f"the weights in {checkpoint} cannot continue under {describe(fixed)}; resume with the run's "
                    "values, or start a new run without --ckpt_path"
                )
            if not allow_config_change:
                raise UsageError(
                    f"the config differs from the one of the run in {source} ({describe(changes)}); resume with "
                    "that run's config, or add --allow_config_change true to continue it under this one "
                    "(both configs stay recorded in the run)"
                )
        if checkpoint is None:
            existing = sorted((own / CHECKPOINTS).glob("*.ckpt"))
            if existing:
                raise UsageError(
                    f"{own} already holds checkpoints of this exact config ({existing[-1].name}, ...); "
                    "resume it with --ckpt_path last, or delete that folder to train it again from scratch"
                )
        directory = checkpoint_run if checkpoint_run is not None else own
        return cls(subcommand, identity, directory, checkpoint)

    def place(self, trainer: Namespace) -> None:
        """Point the loggers (and the root dir) at this run: its directory, its name (the short hash).

        TensorBoard (or CSV) loggers write into the run directory and come first in the list, since
        Lightning puts checkpoints under the first logger's folder; an MLflow run and a W&B run are
        named by the hash (unless named in the config), and W&B's offline files go into the run directory.
        """
        self._given = {"trainer.default_root_dir": trainer.get("default_root_dir")}
        if isinstance(trainer.get("logger"), list):  # directory loggers first, the others in their order
            trainer.logger = sorted(trainer.logger, key=lambda item: not is_directory_logger(item))
        # The run's folder is the logger's name with an empty version: a version of hex digits that happen to be all
        # decimal (a 12-digit hash, about 1 in 280) would be read as an int, and Lightning writes "version_<int>".
        placements = {"save_dir": str(self.directory.parent), "name": self.directory.name, "version": ""}
        for index, logger in enumerate(loggers(trainer)):
            kind, args = class_of(logger), logger.get("init_args", Namespace())
            if issubclass(kind, DIRECTORY_LOGGERS):
                wanted = placements
            elif issubclass(kind, MLFlowLogger) and args.get("run_name") is None:
                wanted = {"run_name": self.directory.name}
            elif issubclass(kind, WandbLogger):
                wanted = {"save_dir": str(self.directory)}
                if not args.get("name"):
                    wanted["name"] = self.directory.name
            else:
                continue
            for key, value in wanted.items():
                self._given[("logger", index, key)] = args.get(key)
                logger.init_args[key] = value
        # Checkpoints in <run>/checkpoints/ whatever the first logger is (Lightning would put them under
        # an MLflow logger's experiment and run ids).
        for index, callback in enumerate(callbacks(trainer)):
            if issubclass(class_of(callback), ModelCheckpoint) and callback.init_args.get("dirpath") is None:
                self._given[("callback", index, "dirpath")] = None
                callback.init_args.dirpath = str(self.directory / CHECKPOINTS)
        # Lightning's own files (SLURM's hpc_ckpt_*.ckpt, profiler output) go here too, so that a
        # SLURM job auto-resumes only a run of its own config.
        trainer.default_root_dir = str(self.directory)

    def take(self) -> None:
        """Note what the directory holds now and, for ``fit``, take its lock (see ``run_lock.py``) or refuse.

        Called once the run is planned, before anything is built or written, by the process that
        writes the run (rank 0).
        """
        self._new_folders = NewFolders(self.directory)
        self._before = _snapshot(self.directory) if self._new_folders.topmost is None else {}
        self._lock = RunLock(self.directory)
        if self.subcommand == "fit":
            with self._new_folders:  # held by another process: touch nothing of its run
                self._lock.acquire()

    def undo(self) -> None:
        """Put the directory back as ``take`` found it and let go of the lock.

        A new directory (and any folder above it made for it) is removed; in an existing one,
        files the session added are deleted and small files it rewrote (``config_hash.txt``,
        ``hparams.yaml``) get their old bytes back. Checkpoints are never rewritten before the
        first step (see ``RunRecord.on_exception``), so they need no restoring.
        """
        if self._lock is None:
            return
        if self._new_folders.topmost is not None:
            self._new_folders.remove()
        else:
            _restore(self.directory, self._before)
        self._lock.release()

    def as_given(self, config: Namespace) -> Namespace:
        """``config`` with where files go as the user gave it and no launch switch: what ``config.yaml`` records.

        So ``main.py fit --config <run>/config.yaml`` names this same run again (placement and
        launch switches are outside the run's identity, see ``config_hash.py``).
        """
        config = config.clone()
        for key, value in self._given.items():
            if isinstance(key, tuple):  # ("logger" or "callback", index in its list, init_args key)
                kind, index, name = key
                (loggers if kind == "logger" else callbacks)(config.trainer)[index].init_args[name] = value
            else:
                config[key] = value
        for key in LAUNCH_SWITCHES:
            if key in config:
                config[key] = None if key == "ckpt_path" else False
        return config

    @contextmanager
    def held(self, keep: Any) -> Iterator[None]:
        """Run the body with the run taken; ``undo`` if it raises and ``keep()`` is false; let go at the end."""
        if self._lock is None:
            self.take()
        try:
            yield
        except BaseException:
            if not keep():
                self.undo()
            raise
        finally:
            self._lock.release()


def _snapshot(directory: Path) -> dict[Path, bytes | None]:
    """Every file under ``directory``: its bytes if small and not a checkpoint, else None."""
    files: dict[Path, bytes | None] = {}
    for path in directory.rglob("*"):
        if path.is_file():
            small = path.suffix != ".ckpt" and path.stat().st_size <= SMALL_FILE_BYTES
            files[path] = path.read_bytes() if small else None
    return files


def _restore(directory: Path, before: dict[Path, bytes | None]) -> None:
    for path in sorted(directory.rglob("*"), reverse=True):  # children before their folders
        if path in before:
            if before[path] is not None and path.read_bytes() != before[path]:
                path.write_bytes(before[path])
        elif path.is_dir():
            if not any(known.is_relative_to(path) for known in before):
                shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def recorded_config(stored: dict[str, Any], checkpoint: Path) -> str:
    """The config a checkpoint records (JSON text, only compared with the command's), or one line why it is not one."""
    text = stored.get("config", "{}")
    try:
        if isinstance(text, str) and isinstance(json.loads(text), dict):
            return text
    except (ValueError, RecursionError):
        pass
    raise CheckpointError(f"{checkpoint}: config is not the record of a config; {HOW_TO_TRUST}")
