"""Runs: what a run is, where it lives, which run a command continues, and undoing a start that failed.

- **Identity.** A run is its resolved config (minus keys that cannot change results, see
  ``config_hash.py``) plus a fingerprint of its data (the dataset and its archive's MD5: what
  the data is, not where it lies). The SHA-256 of both names it; the first 12 hex digits name
  its directory, ``<logger save_dir>/<logger name>/<hash>/``.
- **Resuming.** ``--ckpt_path last`` continues this config's run; failing that, the latest run
  of the same experiment folder, but only if its config is the same or ``--allow_config_change``
  is given. Anything else is refused before a file is written (see the README's table).
- **Holding.** One process trains a run at a time (``run_lock.py``).
- **Failing.** A session that fails before its first optimizer step leaves the disk as it was.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, MLFlowLogger, TensorBoardLogger, WandbLogger

from .config_hash import LAUNCH_SWITCHES, SHORT_LENGTH, canonical_config
from .errors import UsageError
from .files import NewFolders
from .run_lock import RunLock

CHECKPOINTS = "checkpoints"
LAST = "last.ckpt"
HASH_FILENAME = "config_hash.txt"
# --ckpt_path values Lightning resolves itself.
LIGHTNING_KEYWORDS = ("best", "hpc", "registry")
# Files a session may rewrite in an existing run directory, restored if it fails before training.
SMALL_FILE_BYTES = 1 << 20
# Settings that shape the weights (with everything under them, e.g. model.backbone.init_args.width):
# a checkpoint cannot continue under other values, even if allowed.
WEIGHT_SHAPING_KEYS = ("model.backbone", "data.dataset", "data.class_names")


@dataclass(frozen=True)
class RunIdentity:
    """The canonical config (with the data fingerprint) and its SHA-256."""

    canonical: str

    @classmethod
    def of(cls, resolved_config: dict[str, Any], data_fingerprint: str) -> RunIdentity:
        return cls(canonical_config({**resolved_config, "data_fingerprint": data_fingerprint}))

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.canonical.encode()).hexdigest()

    @property
    def short(self) -> str:
        return self.hash[:SHORT_LENGTH]

    def run_dir(self, parent: Path) -> Path:
        """The folder this identity's run has under ``parent`` (an experiment, or an evaluated run's stage)."""
        return Path(parent) / self.short

    def changes_from(self, other_canonical: str) -> dict[str, str]:
        return config_changes(json.loads(other_canonical), json.loads(self.canonical))


def config_changes(old: dict, new: dict, prefix: str = "") -> dict[str, str]:
    """``{dotted key: "old -> new"}`` for every leaf that differs between two configs."""
    changes = {}
    for key in sorted(set(old) | set(new)):
        before, after = old.get(key, "<unset>"), new.get(key, "<unset>")
        if isinstance(before, dict) and isinstance(after, dict):
            changes.update(config_changes(before, after, f"{prefix}{key}."))
        elif before != after:
            changes[f"{prefix}{key}"] = f"{json.dumps(before)} -> {json.dumps(after)}"
    return changes


def shapes_weights(key: str) -> bool:
    return any(key == shaping or key.startswith(f"{shaping}.") for shaping in WEIGHT_SHAPING_KEYS)


def describe(changes: dict[str, str]) -> str:
    return "; ".join(f"{key}: {change}" for key, change in changes.items())


def loggers(trainer: Namespace) -> list[Namespace]:
    """The configured loggers (``trainer.logger`` is one or a list), as class_path/init_args namespaces."""
    logger = trainer.get("logger")
    return [item for item in (logger if isinstance(logger, list) else [logger]) if isinstance(item, Namespace)]


def callbacks(trainer: Namespace) -> list[Namespace]:
    """The configured callbacks, as class_path/init_args namespaces."""
    return [item for item in trainer.get("callbacks") or [] if isinstance(item, Namespace) and "class_path" in item]


def class_of(item: Namespace) -> type:
    """The class a ``class_path`` namespace names (a logger's or a callback's)."""
    module, _, name = str(item.class_path).rpartition(".")
    return getattr(importlib.import_module(module), name)


def is_directory_logger(logger: Any) -> bool:
    """A configured logger that writes into ``save_dir/name/version`` (TensorBoard, CSV): it places the run."""
    return isinstance(logger, Namespace) and issubclass(class_of(logger), TensorBoardLogger | CSVLogger)


def experiment_dir(trainer: Namespace) -> Path:
    """The folder holding one directory per run: the first TensorBoard (or CSV) logger's ``save_dir/name``, or ``runs``.

    A relative ``save_dir`` lies under ``trainer.default_root_dir`` when that is given.
    """
    root = Path(trainer.get("default_root_dir") or ".")
    for logger in loggers(trainer):
        if is_directory_logger(logger):
            args = logger.init_args
            return root / str(args.save_dir) / str(args.get("name") or "")
    return root / "runs"


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


@dataclass
class Session:
    """What this command's training did: counted by ``RunRecord``, read by the CLI and the summary."""

    first_step: int | None = None
    last_step: int = 0
    images: int = 0
    started: float = field(default_factory=time.perf_counter)
    stopped_by: BaseException | None = None  # what ended training early, as Lightning saw it

    @property
    def steps_taken(self) -> int:
        return self.last_step - self.first_step if self.first_step is not None else 0

    @property
    def trained(self) -> bool:
        """Whether this session has taken an optimizer step."""
        return self.steps_taken > 0

    @property
    def elapsed(self) -> float:
        """Seconds since this session's training started."""
        return time.perf_counter() - self.started


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
            changes = identity.changes_from(stored.get("config", "{}"))
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
        placements = {"save_dir": str(self.directory.parent), "name": "", "version": self.directory.name}
        for index, logger in enumerate(loggers(trainer)):
            kind, args = class_of(logger), logger.get("init_args", Namespace())
            if issubclass(kind, TensorBoardLogger | CSVLogger):
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
