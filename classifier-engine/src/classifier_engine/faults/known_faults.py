"""What ended a run, in one line: what happened, where its last good state is, and what to do.

The faults that end long runs on shared machines each get their own line: a full disk, a GPU out
of memory, a loader worker killed (by the kernel, for host memory) or failed (a store that stopped
answering mid-run, for a streamed dataset), a diverged loss. Any other
error is named by its type and first line. Each line names the newest complete checkpoint of the
run with its step, as the file itself records it, so ``--ckpt_path last`` continues from a state
the user was told about; the caller adds where the full report is (``error_report.py``).
"""

from __future__ import annotations

import re
from pathlib import Path

import lightning as L
import torch

from ..checkpoints.checkpoint_io import stored_entry
from ..data.streams.object_store import is_remote
from ..foundation.errors import RUNTIME, UserError
from ..foundation.files import NoSpaceError, is_full_disk
from ..runs.resolution import CHECKPOINTS, LAST

WORKER_KILLED = re.compile(r"DataLoader worker \(pids?(?:\(s\))? ([\d, ]+)\) (?:is killed by signal: ([^.]+)|exited)")
# torch re-raises a loader worker's exception in the training process with the worker's traceback as text
WORKER_RAISED = re.compile(r"^Caught \w+ in DataLoader worker process \d+\.")
RAISED_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit): .+")
# what a store's clients (boto3, obstore) say when the store stopped answering or refused a read mid-run
STORE_WORDS = re.compile(r"S3 error|GCS error|ClientError|EndpointConnectionError|Timeout|error sending request")
WORKER_REASON_CHARACTERS = 300
LITDATA_RELAYED = "Original error: "


class FaultError(UserError):
    """A run ended by its machine or its numbers, not by a mistake in the command: its logs are kept."""

    exit_code = RUNTIME


def newest_checkpoint(run_dir: Path) -> tuple[Path, int] | None:
    """``last.ckpt`` of the run with its step, else its checkpoint holding the most steps; None if it has none."""
    folder = Path(run_dir) / CHECKPOINTS
    steps = {}
    for path in sorted(folder.glob("*.ckpt")) if folder.is_dir() else []:
        step = stored_entry(path, "global_step")
        if step is not None:
            steps[path] = int(step)
    if not steps:
        return None
    last = folder / LAST
    return (last, steps[last]) if last in steps else max(steps.items(), key=lambda item: item[1])


def saved_state(run_dir: Path) -> tuple[str, str]:
    """What the run kept (``<run>/checkpoints/last.ckpt holds step N``) and the option that continues from it."""
    found = newest_checkpoint(run_dir)
    if found is None:
        return "no checkpoint of this run was saved", ""
    path, step = found
    if path.name == LAST:
        return f"{path} holds step {step}", "--ckpt_path last"
    return f"{path} (step {step}) is the run's newest checkpoint", f"--ckpt_path {path}"


def worker_death(error: BaseException) -> re.Match[str] | None:
    """torch's report of a dead loader worker, wherever it sits in ``error``'s chain.

    torch's SIGCHLD handler raises in whatever the main thread runs at that moment; a library that catches and
    raises again (a logger writing a scalar, say) leaves torch's report as the cause or the context.
    """
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, RuntimeError) and (found := WORKER_KILLED.search(str(error))):
            return found
        error = error.__cause__ or error.__context__
    return None


def how_it_diverged(error: BaseException, first_nonfinite_step: int | None) -> str:
    """``the loss stopped being finite at step N`` when the guard saw it, else what the raiser said."""
    return f"the loss stopped being finite at step {first_nonfinite_step}" if first_nonfinite_step else str(error)


def describe_fault(error: BaseException, trainer: L.Trainer, run_dir: Path, first_nonfinite_step: int | None) -> str:
    """The one line (without ``error:``) for ``error``, which ended a command of the run in ``run_dir``."""
    fitting = trainer.state.fn is not None and trainer.state.fn.value == "fit"
    kept, resume = saved_state(run_dir) if fitting else ("", "")
    again = f"run the same command with {resume}" if resume else "run the same command"
    if fitting and not resume:
        kept, again = "no checkpoint of this run was saved", "run the same command to start it over"
    state = f"{kept}: " if kept else ""
    if isinstance(error, NoSpaceError) and error.remedy:  # a disk of the data's, whose remedy the error names
        return f"{error}; {kept + '; ' if kept else ''}then {again}"
    if isinstance(error, NoSpaceError) or is_full_disk(error, run_dir):
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        written = f", writing {error.filename}" if isinstance(error, OSError) and error.filename else ""
        what = f"no space left on the disk of {run_dir} ({reason}{written})"
        what = str(error) if isinstance(error, NoSpaceError) else what
        return f"{what}; {state}free space there (or write elsewhere: trainer.logger.init_args.save_dir), then {again}"
    if isinstance(error, torch.OutOfMemoryError):
        size = getattr(trainer.datamodule, "batch_size", None)
        batch = f"data.batch_size {size} per device" if size is not None else "this data.batch_size"
        step = f" at step {trainer.global_step + 1}" if fitting else ""
        keep_step = ""
        if size is not None and fitting:
            images = size * trainer.world_size * trainer.accumulate_grad_batches
            twice = trainer.accumulate_grad_batches * 2
            keep_step = (
                f" (keep {images} images per step with data.global_batch_size {images} and "
                f"trainer.accumulate_grad_batches {twice}; add --allow_config_change true)"
            )
        return (
            f"out of GPU memory{step} with {batch}; {state}lower the batch per device{keep_step}, or use "
            f"trainer.precision bf16-mixed, or data.storage memmap to keep the images off the GPU, then {again}"
        )
    killed = worker_death(error)
    if killed is not None:
        # torch names the signal when its SIGCHLD handler sees the death first, else only that the worker exited
        pid, signal_name = killed.group(1).strip(), killed.group(2)
        how = f"was killed ({signal_name})" if signal_name else "exited unexpectedly"
        workers = getattr(trainer.datamodule, "num_workers", None)
        now = f" (now {workers})" if workers is not None else ""
        return (
            f"a data loader worker (pid {pid}) {how}, most likely killed by the system for lack of "
            f"host memory; {state}lower data.num_workers{now}, or free memory on this machine, then {again}"
        )
    if WORKER_RAISED.match(str(error)):  # raised again as the worker's own type (a dataset's ValueError, ...)
        reason = worker_reason(str(error))
        source = getattr(trainer.datamodule, "source", None)
        if isinstance(source, str) and is_remote(source) and STORE_WORDS.search(reason):
            return (
                f"reading {source} failed in a data loader worker ({reason}); {state}check the network and the "
                f"store (AWS_ENDPOINT_URL, data.storage_options), then {again}"
            )
        return f"a data loader worker failed: {reason}; {state}{again}"
    if isinstance(error, FloatingPointError):
        how = how_it_diverged(error, first_nonfinite_step)
        remedy = "lower model.optimizer.init_args.lr or lengthen the warm-up"
        if not resume:
            return f"training diverged: {how}, before any checkpoint was written; {remedy}, then run the command again"
        return (
            f"training diverged: {how}; no checkpoint was written with "
            f"non-finite weights, and {kept}: {remedy}, then continue with {resume} --allow_config_change true, "
            "or start over without --ckpt_path"
        )
    if isinstance(error, UserError):
        return str(error)
    first_line = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    return f"the run failed with {type(error).__name__}: {first_line}; {state}{again}"


def worker_reason(text: str) -> str:
    """The last exception line of a loader worker's traceback, as torch relayed it (the error the worker ended on)."""
    raised = [line.strip() for line in text.splitlines()[1:] if RAISED_LINE.match(line)]
    reason = raised[-1] if raised else text.splitlines()[0]
    reason = " ".join(reason.split(LITDATA_RELAYED)[-1].split())  # litdata's prefetch thread: the error it relays
    return reason if len(reason) <= WORKER_REASON_CHARACTERS else reason[: WORKER_REASON_CHARACTERS - 3] + "..."
