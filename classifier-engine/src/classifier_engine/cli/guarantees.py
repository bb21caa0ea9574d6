"""What the project's promises rest on, installed by the CLI whatever ``trainer.callbacks`` and ``trainer.plugins`` say.

A config replaces lists (a stacked config's ``trainer.callbacks`` drops the default one), so what
resume, exact restarts and a clean stop need cannot live in the user's list:

- ``checkpoints/last.ckpt`` of the run, rewritten at every epoch end, every ``safety.last_every_n_train_steps``
  optimizer steps if set, and when training stops early (a signal, an error) once a step was taken;
- ``StopOnSignal``: SIGTERM, Ctrl-C and the cluster's warning signal stop every rank after the same batch;
- ``RandomState``: every random generator's state in each checkpoint;
- ``AtomicCheckpointIO``: each checkpoint file complete or absent, and never one of non-finite weights;
- ``DivergenceGuard``: a run whose loss stopped being finite ends as a failure, saying at which step;
- the model's guarantees (``model_guarantees.py``): its calibration fitted, kept and restored, the training
  totals of a resumed epoch, the final validation at ``max_steps``, the schedule at the restored step.

A user's list that would contradict them is refused in one line before anything is built: one of
these classes listed again, another checkpoint writer (a ``CheckpointIO`` plugin), a ``ModelCheckpoint``
of the user's that writes the run's ``last.ckpt`` (any other ``ModelCheckpoint`` is welcome: a best
model by a metric, a checkpoint every N epochs), or ``trainer.enable_checkpointing: false``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from ..checkpoints.checkpoint_io import AtomicCheckpointIO
from ..checkpoints.preprocessing_record import PreprocessingRecord
from ..checkpoints.random_state import RandomState
from ..faults.divergence import DivergenceGuard
from ..faults.rank_failure import RankFailureWatch
from ..faults.stop_on_signal import StopOnSignal
from ..foundation.errors import UsageError
from ..runs.loggers import class_of
from ..runs.resolution import CHECKPOINTS, LAST
from .model_guarantees import INSTALLED_FOR_MODEL, model_guarantees


class LastCheckpoint(ModelCheckpoint):
    """``checkpoints/last.ckpt``: the latest state, which ``--ckpt_path last`` resumes (the CLI installs it)."""

    def __init__(self, run_dir: Path, every_n_train_steps: int | None = None) -> None:
        # ModelCheckpoint's own save_last refreshes last.ckpt only when the best model changes: a
        # ModelCheckpoint without a monitor named "last" rewrites it on every save instead.
        super().__init__(
            dirpath=Path(run_dir) / CHECKPOINTS,
            filename=Path(LAST).stem,
            enable_version_counter=False,
            save_on_exception=True,
            every_n_train_steps=every_n_train_steps,
        )


class Safety:
    """The settings of what the CLI installs (``safety.*`` in a config); none of it can be switched off."""

    def __init__(
        self,
        last_every_n_train_steps: int | None = None,
        requeue_signal: str = "SIGUSR1",
        max_nonfinite_steps: int = 25,
    ) -> None:
        """Tune the stops and saves that resume relies on.

        Args:
            last_every_n_train_steps: Also rewrite checkpoints/last.ckpt every N optimizer steps (long epochs
                on machines that can be taken away); by default it is written at epoch ends and stops.
            requeue_signal: The signal a scheduler sends before the time limit (#SBATCH --signal=SIGUSR1@90):
                the run stops with a checkpoint and a SLURM job requeues itself.
            max_nonfinite_steps: End the run as diverged after this many optimizer steps in a row with a NaN or
                infinite loss (at once when the weights themselves are no longer finite); no checkpoint is written.
        """
        if last_every_n_train_steps is not None and last_every_n_train_steps < 1:
            raise ValueError(
                f"safety.last_every_n_train_steps must be a positive integer, got {last_every_n_train_steps}"
            )
        if max_nonfinite_steps < 1:
            raise ValueError(f"safety.max_nonfinite_steps must be a positive integer, got {max_nonfinite_steps}")
        self.last_every_n_train_steps = last_every_n_train_steps
        self.divergence = DivergenceGuard(max_nonfinite_steps)
        self.stop = StopOnSignal(requeue_signal)  # checks the name now: a bad one is refused before training
        self.peers = RankFailureWatch()

    def callbacks(self, run_dir: Path) -> list[Callback]:
        """The callbacks to add to the user's list (checkpoint writers last, as Lightning orders them anyway)."""
        writers = [LastCheckpoint(run_dir)]
        if self.last_every_n_train_steps is not None:  # a second writer: ModelCheckpoint saves by epoch or by step
            writers.append(LastCheckpoint(run_dir, self.last_every_n_train_steps))
        return [
            self.peers,
            self.stop,
            RandomState(),
            PreprocessingRecord(),
            *model_guarantees(),
            self.divergence,
            *writers,
        ]


INSTALLED = (
    RankFailureWatch,
    StopOnSignal,
    RandomState,
    PreprocessingRecord,
    DivergenceGuard,
    LastCheckpoint,
    AtomicCheckpointIO,
    *INSTALLED_FOR_MODEL,
)


def as_list(value: Any) -> list[Any]:
    return [] if value is None else list(value) if isinstance(value, list) else [value]


def _classes(items: Any) -> list[tuple[type, Namespace]]:
    return [(class_of(item), item) for item in as_list(items) if isinstance(item, Namespace) and "class_path" in item]


def check_user_parts(trainer: Namespace) -> None:
    """Refuse, in one line, a ``trainer`` config whose callbacks or plugins contradict what the CLI installs."""
    if trainer.get("enable_checkpointing") is False:
        raise UsageError(
            "trainer.enable_checkpointing is false, which would leave the run without checkpoints/last.ckpt to "
            "resume; remove it (fast_dev_run runs a few batches without writing anything)"
        )
    for key in ("callbacks", "plugins"):
        for kind, item in _classes(trainer.get(key)):
            if issubclass(kind, INSTALLED):
                raise UsageError(
                    f"trainer.{key}: {kind.__name__} is installed by the project whatever the config; remove it from "
                    "the list (safety.* tunes what can be tuned: python main.py fit --help)"
                )
            if issubclass(kind, CheckpointIO):
                raise UsageError(
                    f"trainer.plugins: {kind.__name__} would replace the writer that keeps every checkpoint complete "
                    "or absent; remove it from the list"
                )
            if issubclass(kind, ModelCheckpoint):
                args = item.get("init_args") or Namespace()
                if args.get("dirpath") is None and (args.get("filename") == Path(LAST).stem or args.get("save_last")):
                    raise UsageError(
                        f"trainer.callbacks: a {kind.__name__} with filename last or save_last would write the run's "
                        f"{CHECKPOINTS}/{LAST}, which the project keeps itself (each epoch, at a stop, and every "
                        "safety.last_every_n_train_steps steps); give it another filename, e.g. best-{epoch:03d}"
                    )


def with_atomic_writes(plugins: Any) -> tuple[list[Any], AtomicCheckpointIO]:
    """The user's plugins (already checked) plus the atomic checkpoint writer (and reader), and that writer."""
    writer = AtomicCheckpointIO()
    return [*as_list(plugins), writer], writer
