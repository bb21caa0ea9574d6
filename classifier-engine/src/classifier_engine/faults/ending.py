"""How a fit that stopped early ends: one message naming the checkpoint it left, a requeue, the exit status.

A run stopped by a signal exits as the shell reports a process that the signal ended
(128 + its number), after its checkpoint is written, so that ``python main.py fit ... && python
export.py ...`` never ships a half-trained model. The message names the ``last.ckpt`` this
session completed, with its step, as the checkpoint writer recorded it; if this session saved
none, the one from before (or none) is named as such.
"""

from __future__ import annotations

import signal

import lightning as L
from lightning.pytorch.utilities.exceptions import SIGTERMException

from ..checkpoints.checkpoint_io import AtomicCheckpointIO, stored_entry
from ..runs.resolution import CHECKPOINTS, LAST
from ..runs.run import Run
from .stop_on_signal import StopOnSignal

# What Lightning raises for a stop it saw, and the signal behind it.
STOPPED_BY = {KeyboardInterrupt: signal.SIGINT, SIGTERMException: signal.SIGTERM}
SIGNAL_NAMES = {signal.SIGINT: "Ctrl-C"}


def exit_status(signum: int) -> int:
    """The shell's convention for a process a signal ended: 128 + the signal's number."""
    return 128 + signum


def stop_signal(error: BaseException | None, stop: StopOnSignal) -> signal.Signals | None:
    """The signal that ended training: the one every rank agreed on, else the one Lightning's exception stands for."""
    if stop.signal is not None:
        return stop.signal
    return next((number for kind, number in STOPPED_BY.items() if isinstance(error, kind)), None)


def stopped_message(trainer: L.Trainer, run: Run, writer: AtomicCheckpointIO, cause: signal.Signals | None) -> str:
    """``Stopped by SIGTERM at step N; <run>/checkpoints/last.ckpt holds step N: ...`` (what is true, nothing else)."""
    by = f" by {SIGNAL_NAMES.get(cause, cause.name)}" if cause is not None else " by an error"
    last = run.directory / CHECKPOINTS / LAST
    saved = next((step for path, step in writer.written.items() if path.resolve() == last.resolve()), None)
    head = f"Stopped{by} at step {trainer.global_step}"
    advice = "run the same command with --ckpt_path last to continue"
    if saved is not None:
        return f"{head}; {last} holds step {saved}: {advice}"
    earlier = stored_entry(last, "global_step") if last.is_file() else None
    if earlier is not None:
        return f"{head}; nothing was saved this session, {last} still holds step {earlier}: {advice} from there"
    return f"{head}; nothing was saved, so there is nothing to resume: run the command again to start over"


def end_early(
    error: BaseException, trainer: L.Trainer, run: Run, stop: StopOnSignal, writer: AtomicCheckpointIO, trained: bool
) -> int | None:
    """Say where a command that ended early left its run (if it trained), requeue it if asked; its exit status.

    None means an error that is not a stop: the caller re-raises it, to be reported as an error.
    """
    cause = stop_signal(run.session.stopped_by or error, stop)
    if trainer.is_global_zero:
        if trained and cause is not None:  # an error's own line names the checkpoint it left (faults.py)
            print(stopped_message(trainer, run, writer, cause))
        if stop.requeue_wanted:  # the cluster's warning signal, once the checkpoint is written: back in the queue
            message = stop.requeue()
            if message:
                print(message)
    return exit_status(cause) if cause is not None else None
