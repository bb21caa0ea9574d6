"""What a run directory records about itself, and what a session that has not trained yet may not write."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import MLFlowLogger
from typing_extensions import override

from .console_log import CONSOLE
from .loggers import is_tracker
from .run import HASH_FILENAME, Run


class RunRecord(SaveConfigCallback):
    """Save ``config.yaml`` and ``config_hash.txt`` once per run directory; record the identity everywhere.

    The directory is named by the run's identity, so a config already there describes the same
    computation and a resumed run keeps the original record. A resume allowed to change the config
    adds ``config-<hash>.yaml`` and appends its hash to ``config_hash.txt``. Rank 0 looks, then
    broadcasts, as the parent class does. The full hash and canonical config (with the data
    fingerprint) go into every checkpoint, and the hash to the logger's hyperparameters.

    It also counts this session's steps and images (``run.session``): until the first optimizer step, an exception
    must not rewrite a checkpoint (the run's ``last.ckpt`` may belong to another config, and
    nothing was learned), and the summary reports the session's throughput.
    """

    def __init__(self, *args: Any, run: Run, **kwargs: Any) -> None:
        # config.yaml goes to the run directory, not to trainer.log_dir: the first logger's folder,
        # which an MLflow logger (a database, no folder) does not have.
        super().__init__(*args, save_to_log_dir=False, **kwargs)
        self.run = run
        self.session = run.session  # what the CLI and the summary read back
        self._recording = False

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not self.already_saved:
            self.config = self.run.as_given(self.config)  # so that fit --config config.yaml names this run again
            self.log_dir = str(self.run.directory)
            recorded = self._recorded_hashes() if trainer.is_global_zero else []
            recorded = trainer.strategy.broadcast(recorded)
            if recorded and self.run.identity.hash not in recorded:
                self.config_filename = f"config-{self.run.identity.short}.yaml"  # a changed resume
            self.already_saved = self.run.identity.hash in recorded
        super().setup(trainer, pl_module, stage)

    def _recorded_hashes(self) -> list[str]:
        hashes = Path(self.log_dir, HASH_FILENAME)
        if hashes.is_file():
            return hashes.read_text().split()
        return [self.run.identity.hash] if Path(self.log_dir, self.config_filename).is_file() else []

    @override
    def save_config(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # rank 0 only: no collectives here
        config_path = Path(self.log_dir, self.config_filename)
        config_path.parent.mkdir(parents=True, exist_ok=True)
        self.parser.save(self.config, str(config_path), skip_none=False, overwrite=True, multifile=self.multifile)
        with open(Path(self.log_dir, HASH_FILENAME), "a") as hashes:
            hashes.write(self.run.identity.hash + "\n")
        for logger in trainer.loggers:
            logger.log_hyperparams({"config_hash": self.run.identity.hash})
            if is_tracker(logger):  # the whole config as its parameters
                logger.log_hyperparams(json.loads(self.run.identity.canonical))
            if isinstance(logger, MLFlowLogger):  # and the file itself
                logger.experiment.log_artifact(logger.run_id, str(config_path))

    @override
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        checkpoint["config_hash"] = self.run.identity.hash
        checkpoint["config"] = self.run.identity.canonical

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.session.first_step = self.session.last_step = trainer.global_step
        self.session.started = time.perf_counter()

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        self.session.last_step = trainer.global_step
        self.session.images += len(batch[0]) * trainer.world_size
        if self.session.trained and not self._recording:  # worth keeping now: logs/console.log from the start
            CONSOLE.attach(self.run.directory, trainer.global_rank)
            self._recording = True

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        # Lightning turns Ctrl-C into sys.exit(1) afterwards; the exit code is decided from this instead.
        self.session.stopped_by = exception
        # Runs before the ModelCheckpoints' own on_exception (Lightning puts checkpoint callbacks last).
        if not self.session.trained:
            for callback in trainer.checkpoint_callbacks:
                if isinstance(callback, ModelCheckpoint):
                    callback.save_on_exception = False
