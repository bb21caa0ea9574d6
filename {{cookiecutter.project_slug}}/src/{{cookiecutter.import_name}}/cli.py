"""The command line: LightningCLI wired to the data and model, with one directory per run.

Each run's TensorBoard logs, ``config.yaml`` and ``checkpoints/`` live in
``<save_dir>/<name>/<config hash>/``. The same command therefore always finds its own
run again, which is what makes ``fit --ckpt_path last`` resume instead of silently
starting over in a fresh ``version_N``. Resuming from a checkpoint file of a run continues
in that run's directory, and only with the same config unless a change is allowed.
"""

from __future__ import annotations

import json
import os
from functools import cached_property
from pathlib import Path

from jsonargparse import Namespace
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback

from .checkpointing import CheckpointError, read_checkpoint
from .config_hash import SHORT_LENGTH, canonical_config, config_hash
from .data import CifarDataModule
from .models import ImageClassifier

HASH_FILENAME = "config_hash.txt"


def resolved_config(parser: LightningArgumentParser, config: Namespace) -> dict:
    return json.loads(parser.dump(config, format="json", skip_check=True))


def config_changes(old: dict, new: dict, prefix: str = "") -> list[str]:
    """``key: old -> new`` for every leaf that differs between two configs."""
    changes = []
    for key in sorted(set(old) | set(new)):
        before, after = old.get(key, "<unset>"), new.get(key, "<unset>")
        if isinstance(before, dict) and isinstance(after, dict):
            changes += config_changes(before, after, f"{prefix}{key}.")
        elif before != after:
            changes.append(f"{prefix}{key}: {json.dumps(before)} -> {json.dumps(after)}")
    return changes


class KeepFirstConfig(SaveConfigCallback):
    """Save ``config.yaml`` and ``config_hash.txt`` once per run directory; record the hash everywhere.

    The directory is named by the config's hash, so a config already there describes the
    same computation and a resumed run keeps the original record. A resume allowed to
    change the config adds ``config-<hash>.yaml`` and appends its hash to ``config_hash.txt``.
    Rank 0 looks, then broadcasts, as the parent class does. The full hash and canonical
    config also go into every checkpoint, and the hash to the logger's hyperparameters.
    """

    @cached_property
    def canonical(self) -> str:
        return canonical_config(resolved_config(self.parser, self.config))

    @cached_property
    def config_hash(self) -> str:
        return config_hash(resolved_config(self.parser, self.config))

    def setup(self, trainer, pl_module, stage: str) -> None:
        if not self.already_saved:
            self.log_dir = trainer.log_dir  # a collective call: every rank makes it, here
            recorded = self._recorded_hashes() if trainer.is_global_zero else []
            recorded = trainer.strategy.broadcast(recorded)
            if recorded and self.config_hash not in recorded:
                self.config_filename = f"config-{self.config_hash[:SHORT_LENGTH]}.yaml"  # a changed resume
            self.already_saved = self.config_hash in recorded
        super().setup(trainer, pl_module, stage)

    def _recorded_hashes(self) -> list[str]:
        hashes = Path(self.log_dir, HASH_FILENAME)
        if hashes.is_file():
            return hashes.read_text().split()
        return [self.config_hash] if Path(self.log_dir, self.config_filename).is_file() else []

    def save_config(self, trainer, pl_module, stage: str) -> None:  # rank 0 only: no collectives here
        with open(Path(self.log_dir, HASH_FILENAME), "a") as hashes:
            hashes.write(self.config_hash + "\n")
        for logger in trainer.loggers:
            logger.log_hyperparams({"config_hash": self.config_hash})

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        checkpoint["config_hash"] = self.config_hash
        checkpoint["config"] = self.canonical


class TrainerCLI(LightningCLI):
    """``python main.py {fit,validate,test,predict} --config configs/...yaml``."""

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("save_config_callback", KeepFirstConfig)
        # The model takes its optimizer as an argument (model.optimizer), so no top-level group.
        kwargs.setdefault("auto_configure_optimizers", False)
        super().__init__(ImageClassifier, CifarDataModule, **kwargs)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        for key in ("num_classes", "class_names", "mean", "std"):
            parser.link_arguments(f"data.{key}", f"model.{key}", apply_on="instantiate")
        parser.add_argument(
            "--allow_config_change",
            type=bool,
            default=False,
            help="Resume from a checkpoint whose run had another config (e.g. to extend max_epochs).",
        )

    def _parse_ckpt_path(self) -> None:
        """Refuse an unreadable or foreign checkpoint with a message, not a pickle traceback."""
        subcommand = self.config.get("subcommand")  # self.subcommand is set only after this runs
        path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if path and os.path.isfile(path):
            try:
                self.checkpoint = read_checkpoint(path)
            except CheckpointError as error:
                raise SystemExit(f"error: --ckpt_path {error}") from error
        super()._parse_ckpt_path()

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        self.run_hash = config_hash(resolved_config(self._parser(self.subcommand), config))
        checkpoint_run = self._checkpoint_run(config)
        if self.subcommand == "fit" and checkpoint_run is not None:
            self._check_resumed_config(config, checkpoint_run)
        self.run_dir = self._place_run(config, self.run_hash[:SHORT_LENGTH], self.subcommand, checkpoint_run)

    @staticmethod
    def _checkpoint_run(config: Namespace) -> Path | None:
        """The run directory holding the ``--ckpt_path`` file, if it is one of ours."""
        ckpt = Path(str(config.get("ckpt_path") or ""))
        if not (ckpt.is_file() and ckpt.parent.name == "checkpoints"):
            return None
        # Relative to the working directory when inside it, as runs/... paths are when the run writes them.
        relative = Path(os.path.relpath(ckpt.parent.parent))
        return ckpt.parent.parent if relative.parts[:1] == ("..",) else relative

    def _check_resumed_config(self, config: Namespace, checkpoint_run: Path) -> None:
        stored = getattr(self, "checkpoint", {})
        old_hash = stored.get("config_hash")
        if old_hash is None or old_hash == self.run_hash:
            return
        changes = config_changes(json.loads(stored["config"]), json.loads(canonical_config(
            resolved_config(self._parser(self.subcommand), config))))  # fmt: skip
        if not config.allow_config_change:
            raise SystemExit(
                f"error: the config differs from the one that wrote {config.ckpt_path}:\n  "
                + "\n  ".join(changes)
                + "\nResume with the original config, or pass --allow_config_change true to continue this run "
                "with the new one (the new config and hash are recorded beside the old)."
            )

    @staticmethod
    def _place_run(config: Namespace, short_hash: str, subcommand: str | None, checkpoint_run: Path | None) -> Path:
        """Point the logger (or, without one, the root dir) at this config's run directory.

        Resuming a run's checkpoint continues in that run's directory. Evaluating one
        (validate/test/predict) logs inside it, under ``<subcommand>/<hash>/``, so results
        sit beside what produced them.
        """
        trainer = config.trainer
        logger = trainer.logger
        if isinstance(logger, Namespace) and "save_dir" in logger.get("init_args", Namespace()):
            args = logger.init_args
            if checkpoint_run is not None and subcommand == "fit":
                args.save_dir, args.name, args.version = str(checkpoint_run.parent), "", checkpoint_run.name
            elif checkpoint_run is not None:
                args.save_dir, args.name = str(checkpoint_run), subcommand
            if args.get("version") is None:
                args.version = short_hash
            run_dir = Path(args.save_dir, args.get("name") or "", str(args.version))
        else:
            run_dir = Path(trainer.default_root_dir or "runs", short_hash)
        # Lightning's own files (SLURM's hpc_ckpt_*.ckpt, profiler output) go here too, so that a
        # SLURM job auto-resumes only a run of its own config.
        trainer.default_root_dir = str(run_dir)
        return run_dir

    def before_fit(self) -> None:
        """Refuse to start a fresh run on top of a finished one of the same config."""
        if self.config.fit.ckpt_path is not None:
            return
        checkpoints = sorted((self.run_dir / "checkpoints").glob("*.ckpt"))
        if checkpoints:
            raise SystemExit(
                f"error: {self.run_dir} already holds checkpoints of this exact config "
                f"({checkpoints[-1].name}, ...). Resume it with --ckpt_path last, or delete that "
                "directory to train it again from scratch."
            )
