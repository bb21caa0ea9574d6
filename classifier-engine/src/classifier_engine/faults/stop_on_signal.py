"""SIGTERM (pre-emption), Ctrl-C and the cluster's warning signal stop every rank at the same batch, with a checkpoint.

Lightning's own handling has two flaws on a cluster. Its SIGTERM handler runs a collective
(a broadcast) inside the signal handler, at whatever point each rank happens to be, so a
multi-process run that receives SIGTERM hangs. Ctrl-C raises KeyboardInterrupt wherever Python is,
possibly inside the optimizer's update, so the checkpoint written then may hold half a step. Its
SLURM handler for SIGUSR1 saves a checkpoint
from inside the signal handler, wherever the step is, names it ``hpc_ckpt_N.ckpt`` (which
``--ckpt_path last`` does not resume) and keeps training until the job is killed.

Here a signal only sets a flag. A single process raises Lightning's SIGTERM stop at the end of
the current batch; in a multi-process run the ranks agree after each training batch (one
all-reduce) whether any of them was signalled, and if so every rank stops at the end of that
same batch, where ``checkpoints/last.ckpt`` is written
(``save_on_exception``) and from which ``--ckpt_path last`` resumes exactly. For the warning
signal, rank 0 then requeues a SLURM job (``scontrol requeue``, once the checkpoint is on disk:
``ending.py``, which also gives the exit status, 128 + the signal's number). A second Ctrl-C
interrupts at once, as Ctrl-C usually does. With gradient accumulation the stop waits for the
batch that ends the optimizer step: a checkpoint never holds half an accumulated step.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from types import FrameType
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from typing_extensions import override

# What the ranks agree on (the largest wins), and the exit status of each.
NO_SIGNAL, TERMINATE, INTERRUPT, REQUEUE = 0, 1, 2, 3
EXIT_SIGNAL = {TERMINATE: signal.SIGTERM, INTERRUPT: signal.SIGINT}
HEARD_CTRL_C = b"Ctrl-C: stopping after this batch, with a checkpoint (again: at once)\n"


def _child_exited(signum: int, frame: FrameType | None) -> None:
    """SIGCHLD once stopping: a loader worker's exit is left to the loader's own check."""


class StopOnSignal(L.Callback):
    """On SIGTERM, Ctrl-C or ``requeue_signal``: checkpoint at the next batch boundary on every rank and stop."""

    def __init__(self, requeue_signal: str = "SIGUSR1") -> None:
        """``requeue_signal``: what the scheduler sends before the time limit (``#SBATCH --signal``)."""
        try:
            self.requeue_signal = signal.Signals[requeue_signal]
        except KeyError:
            raise ValueError(f"safety.requeue_signal: {requeue_signal!r} is not a signal name (e.g. SIGUSR1)") from None
        if self.requeue_signal in (signal.SIGKILL, signal.SIGSTOP, signal.SIGTERM, signal.SIGINT):
            raise ValueError(
                f"safety.requeue_signal: {requeue_signal} cannot be caught or already stops a run; use SIGUSR1"
            )
        self.received = NO_SIGNAL  # what this process was sent
        self.agreed = NO_SIGNAL  # what all ranks stopped for
        self.slurm_job: str | None = None
        self._restore: dict[signal.Signals, Any] = {}
        self._trainer: L.Trainer | None = None

    @property
    def requeue_wanted(self) -> bool:
        return self.agreed == REQUEUE

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" or threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread (as Lightning's own)
        # A single-device strategy has no cluster environment, but a one-task SLURM job still has a job to requeue.
        environment = getattr(trainer.strategy, "cluster_environment", None)
        if environment is None and SLURMEnvironment.detect():
            environment = SLURMEnvironment()
        if isinstance(environment, SLURMEnvironment) and environment.auto_requeue:
            array = os.environ.get("SLURM_ARRAY_JOB_ID")
            self.slurm_job = f"{array}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array else os.environ["SLURM_JOB_ID"]
        self._trainer = trainer
        handled = (signal.SIGTERM, signal.SIGINT, self.requeue_signal)
        self._restore = {number: signal.getsignal(number) for number in handled}
        # Before Lightning registers its handlers: it leaves a signal that already has one alone.
        signal.signal(self.requeue_signal, self._on_signal)

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # After Lightning registered its SIGTERM handler (it always does): this one replaces it.
        if self._restore:
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT:
            if self.received >= INTERRUPT:
                raise KeyboardInterrupt  # Ctrl-C twice: now
            # Someone is at the keyboard: say that it was heard (the run's ending says the rest), once: a terminal
            # sends Ctrl-C to every rank. os.write, not print: the signal may arrive while Python is printing
            # (print would fail as reentrant).
            if self._trainer is None or self._trainer.is_global_zero:
                os.write(sys.stderr.fileno(), HEARD_CTRL_C)
        elif signum == signal.SIGTERM:
            # A scheduler's SIGTERM reaches the loader workers too, and they die of it. torch's SIGCHLD handler
            # would raise each death inside whatever this process does next (the stop's checkpoint write, which
            # it aborts, or the exit, as a traceback); without it a dead worker is still found by the loader's
            # own check when a batch is next awaited. The process is stopping: the handler is not put back. (A
            # Python handler that does nothing, not SIG_DFL: Python reports a pending signal whose handler became
            # SIG_DFL as "ignored due to race condition".)
            signal.signal(signal.SIGCHLD, _child_exited)
        reason = {self.requeue_signal: REQUEUE, signal.SIGINT: INTERRUPT}.get(signum, TERMINATE)
        self.received = max(self.received, reason)
        trainer = self._trainer
        if trainer is not None and trainer.world_size == 1 and trainer.accumulate_grad_batches == 1:
            self._stop(trainer, self.received)  # no one to agree with, no step half accumulated: this batch

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        if not _ends_an_optimizer_step(trainer, batch_idx):
            return  # a stop here would lose the gradients accumulated so far: stop after the step's last batch
        agreed = self.received
        if trainer.world_size > 1:
            decision = torch.tensor(self.received, device=trainer.strategy.root_device)
            agreed = int(trainer.strategy.reduce(decision, reduce_op="max").item())
        if agreed != NO_SIGNAL:
            self._stop(trainer, agreed)

    def _stop(self, trainer: L.Trainer, reason: int) -> None:
        self.agreed = reason
        # The flag Lightning's SIGTERM handler sets: the loop raises its stop at the end of this batch. Private, with
        # no public route (trainer.received_sigterm only reads it; should_stop would end as if finished, without the
        # exception that writes last.ckpt); tests/test_private_routes.py fails if an upgrade moves it.
        trainer._signal_connector.received_sigterm = True

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._restore_handlers()

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._restore_handlers()

    def _restore_handlers(self) -> None:
        for number, handler in self._restore.items():
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)
        self._restore = {}
        self._trainer = None

    @property
    def signal(self) -> signal.Signals | None:
        """The signal every rank stopped for, or None if none did."""
        return None if self.agreed == NO_SIGNAL else EXIT_SIGNAL.get(self.agreed, self.requeue_signal)

    def requeue(self) -> str | None:
        """``scontrol requeue <job>`` under SLURM (the checkpoint must be on disk already); what happened, in words."""
        if self.slurm_job is None:
            return None
        if not re.fullmatch(r"[0-9]+(_[0-9]+)?", self.slurm_job):
            return f"Not requeued: SLURM_JOB_ID {self.slurm_job!r} is not a job id; resubmit the job"
        try:
            result = subprocess.run(["scontrol", "requeue", self.slurm_job], capture_output=True, text=True)
        except OSError as error:
            return f"Not requeued: scontrol: {error.strerror}; resubmit the job"
        if result.returncode != 0:
            return f"Not requeued: scontrol requeue {self.slurm_job}: {result.stderr.strip()}; resubmit the job"
        return f"Requeued SLURM job {self.slurm_job}: the same command resumes it from checkpoints/last.ckpt"


def _ends_an_optimizer_step(trainer: L.Trainer, batch_idx: int) -> bool:
    """Whether the optimizer stepped after this batch (always, without gradient accumulation)."""
    accumulated = trainer.accumulate_grad_batches
    return accumulated == 1 or (batch_idx + 1) % accumulated == 0 or batch_idx + 1 == trainer.num_training_batches
