"""Callbacks the tests add on the command line: what each rank was fed and ended with; a kill at a chosen moment.

And a pruner that sweep files of the tests name, whose decisions do not depend on the numbers.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
from pathlib import Path

import lightning as L
import optuna


class DataProbe(L.Callback):
    """Write ``rank<N>.json``: the sample ids of every training batch, per epoch, and a weights digest.

    The DDP tests write archives whose images carry their own index in the first two pixels
    (and train without augmentation), so ids are read from the data the rank really received.
    """

    def __init__(self, output_dir: str) -> None:
        self.output_dir = Path(output_dir)
        self.ids: dict[int, list[int]] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        pixels = batch[0][:, 0, 0, :2].long().cpu()
        self.ids.setdefault(trainer.current_epoch, []).extend((pixels[:, 0] * 256 + pixels[:, 1]).tolist())

    def on_train_end(self, trainer, pl_module) -> None:
        digest = hashlib.sha256()
        for name, tensor in sorted(pl_module.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        environment = type(getattr(trainer.strategy, "cluster_environment", None)).__name__  # who launched it
        record = {"world_size": trainer.world_size, "environment": environment, "ids": self.ids}
        record["weights"] = digest.hexdigest()
        self.output_dir.mkdir(parents=True, exist_ok=True)
        (self.output_dir / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


class KillAt(L.Callback):
    """Signal this process (``KILL_SIGNAL``, default SIGKILL) at the moment named by ``KILL_AT``, if set.

    The moment is read from the environment, not the config, so the killed run, its resume and
    the uninterrupted reference share one config (and one run directory). Moments:
    ``train_batch:E:B`` after training batch B of epoch E; ``validation:E`` after the first
    validation batch of epoch E; ``after_checkpoint:E`` at the end of epoch E, after its
    checkpoints are written; ``sanity`` during the sanity-check validation. ``KILL_RANK``, if
    set, names the only rank that is signalled. ``KILL_GROUP=1`` signals the whole process group
    (loader workers too), as a terminal's Ctrl-C or a scheduler's signal to a job does.
    """

    def __init__(self) -> None:
        self.moment = os.environ.get("KILL_AT", "")
        self.signal = signal.Signals[os.environ.get("KILL_SIGNAL", "SIGKILL")]
        self.rank = os.environ.get("KILL_RANK")
        self.group = os.environ.get("KILL_GROUP") == "1"

    def setup(self, trainer, pl_module, stage) -> None:
        if self.rank is not None and int(self.rank) != trainer.global_rank:
            self.moment = ""

    def _kill_if(self, moment: str) -> None:
        if moment == self.moment:
            if self.group:
                os.killpg(os.getpgid(0), self.signal)
            else:
                os.kill(os.getpid(), self.signal)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._kill_if(f"train_batch:{trainer.current_epoch}:{batch_idx}")

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._kill_if("sanity" if trainer.sanity_checking else f"validation:{trainer.current_epoch}")

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._kill_if(f"after_checkpoint:{trainer.current_epoch}")


class PruneLaterTrials(optuna.pruners.BasePruner):
    """Prune every trial but the first once it has reported ``after`` values (epochs)."""

    def __init__(self, after: int = 1) -> None:
        self.after = after

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        return trial.number > 0 and len(trial.intermediate_values) >= self.after
