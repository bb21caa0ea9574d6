"""The command line: LightningCLI wired to the data and model, with one directory per run.

Each run's TensorBoard logs, ``config.yaml`` and ``checkpoints/`` live in
``<save_dir>/<name>/<config hash>/``. The same command therefore always finds its own
run again, which is what makes ``fit --ckpt_path last`` resume instead of silently
starting over in a fresh ``version_N``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from jsonargparse import Namespace
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback

from .config_hash import SHORT_LENGTH, config_hash
from .data import CifarDataModule
from .models import ImageClassifier

CONFIG_FILENAME = "config.yaml"


class KeepFirstConfig(SaveConfigCallback):
    """Save ``config.yaml`` and ``config_hash.txt`` once per run directory; record the hash everywhere.

    The directory is named by the config's hash, so a config already there describes the
    same computation and a resumed run keeps the original record. Rank 0 looks, then
    broadcasts, as the parent class does. The full hash also goes to the logger's
    hyperparameters and into every checkpoint.
    """

    @property
    def config_hash(self) -> str:
        return config_hash(json.loads(self.parser.dump(self.config, format="json", skip_check=True)))

    def setup(self, trainer, pl_module, stage: str) -> None:
        if not self.already_saved:
            self.log_dir = trainer.log_dir  # a collective call: every rank makes it, here
            exists = (
                os.path.isfile(os.path.join(self.log_dir, self.config_filename)) if trainer.is_global_zero else False
            )
            self.already_saved = trainer.strategy.broadcast(exists)
        super().setup(trainer, pl_module, stage)

    def save_config(self, trainer, pl_module, stage: str) -> None:
        Path(self.log_dir, "config_hash.txt").write_text(self.config_hash + "\n")
        for logger in trainer.loggers:
            logger.log_hyperparams({"config_hash": self.config_hash})

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        checkpoint["config_hash"] = self.config_hash


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

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        dumped = json.loads(self._parser(self.subcommand).dump(config, format="json", skip_check=True))
        self.run_hash = config_hash(dumped)
        self.run_dir = self._place_run(config, self.run_hash[:SHORT_LENGTH], self.subcommand)

    @staticmethod
    def _place_run(config: Namespace, short_hash: str, subcommand: str | None) -> Path:
        """Point the logger (or, without one, the root dir) at this config's run directory.

        Evaluating a checkpoint of a run (validate/test/predict) logs inside that run's
        directory, under ``<subcommand>/<hash>/``, so results sit beside what produced them.
        """
        trainer = config.trainer
        logger = trainer.logger
        if isinstance(logger, Namespace) and "save_dir" in logger.get("init_args", Namespace()):
            args = logger.init_args
            ckpt = Path(str(config.get("ckpt_path") or ""))
            if subcommand != "fit" and ckpt.is_file() and ckpt.parent.name == "checkpoints":
                args.save_dir, args.name = str(ckpt.parent.parent), subcommand
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
