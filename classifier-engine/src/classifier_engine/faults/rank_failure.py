"""A fault on one rank ends every rank at once, not at the process group's timeout.

Under DDP every step ends in a collective. A rank that fails leaves its partners waiting in it, and
neither gloo nor NCCL notices a partner that is alive but elsewhere (in its own error handling, or in
another collective) before the timeout: 30 minutes in the DDP preset, with every GPU held. So the
failing rank says so first, in the key-value store every rank of the job already reaches (the
rendezvous at ``MASTER_ADDR:MASTER_PORT``, which Lightning, torchrun and SLURM all set up); a thread
of every rank watches that key and stops its rank within a second, in one line naming the rank that
failed. The failing rank skips the collective save Lightning makes on an exception (its partner
would never join it), so ``last.ckpt`` keeps the last step every rank completed; it writes its
report, marks it written, and ends with its own ``error:`` line. The stopped ranks wait for that
mark (a few seconds at most), so the report is whole and the failing rank's line is the first cause
on the screen.

A rank that dies without a word (SIGKILL, the kernel's OOM killer, a lost node) is the launcher's to
notice: Lightning's launcher terminates its ranks when one exits non-zero, torchrun's agent stops the
others, ``srun --kill-on-bad-exit=1`` (``scripts/slurm.sbatch``) ends the job step. A rank that hangs
without failing ends by the process group's timeout (``docs/cluster.md``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from datetime import timedelta

import lightning as L
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from typing_extensions import override

from ..foundation.process_lifetime import ending_on_its_own
from .known_faults import WORKER_RAISED

POLL_SECONDS = 0.5
REPORT_WAIT = timedelta(seconds=20)  # how long a stopped rank waits for the failing rank's report
GONE_GRACE_SECONDS = 10.0  # how long a rank whose rank 0 vanished waits for its own end before stopping
GRACE_SECONDS = 1.0  # then for its line: a launcher that ends the job on the first exit must not cut it short
STORE_TIMEOUT = timedelta(seconds=10)
STOPPED = 1  # the exit status of a rank stopped because another failed


def _keys() -> tuple[str, str]:
    """The store's keys for this attempt (torchrun's restarts share one store)."""
    prefix = f"rank_failure/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    return f"{prefix}/first", f"{prefix}/reported"


def _store() -> dist.TCPStore:
    """A client of the job's rendezvous store (the one the process group was made with)."""
    return dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=STORE_TIMEOUT,
        wait_for_workers=False,
    )


def short_reason(error: BaseException) -> str:
    """What happened, in a few words, for the other ranks' line."""
    if error.__class__.__name__ == "OutOfMemoryError":
        return "out of GPU memory"
    if WORKER_RAISED.match(str(error)):
        return "a data loader worker failed"
    first_line = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    return f"{type(error).__name__}: {first_line[:120]}"


class RankFailureWatch(Callback):
    """Installed by the CLI: under DDP, a failing rank tells the others, and they stop at once."""

    def __init__(self) -> None:
        self.rank = 0
        self.failed_first: int | None = None  # this rank failed first (its own rank), else None
        self._stopping = threading.Lock()
        self._store: dist.TCPStore | None = None
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if trainer.world_size < 2 or "MASTER_ADDR" not in os.environ or self._thread is not None:
            return
        self.rank = trainer.global_rank
        self._store = _store()
        self._done.clear()
        self._thread = threading.Thread(target=self._watch, name="rank-failure-watch", daemon=True)
        self._thread.start()

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.stop_watching()

    def stop_watching(self) -> None:
        """End the watch thread before the process group goes, and wait for it, on every way out of a command.

        Lightning skips callbacks' ``teardown`` when a stop or an error ends the fit. A watch still polling
        then sees the store close with the group, and a daemon thread still inside the store's C++ call when
        the interpreter ends is unwound through it, which aborts the process (SIGABRT instead of 143).
        """
        self._done.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(STORE_TIMEOUT.total_seconds() + POLL_SECONDS)

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if self._store is None or not isinstance(exception, Exception):  # one process, or Ctrl-C on every rank
            return
        # Lightning runs the checkpoint callbacks' on_exception after this one: their save is a collective
        # that the other ranks, stuck in the step's, would never join. last.ckpt keeps the last whole step.
        for callback in trainer.checkpoint_callbacks:
            if isinstance(callback, ModelCheckpoint):
                callback.save_on_exception = False
        first, _ = _keys()
        mine = f"{self.rank}\t{short_reason(exception)}"
        try:
            won = self._store.compare_set(first, "", mine).decode() == mine
        except Exception:  # the store's host is gone: this rank's report is all there is
            won = True
        if won:
            self.failed_first = self.rank
            ending_on_its_own()  # its launcher ending first must not cut its report short
            return
        self._stop()  # another rank failed first; this error is a consequence

    def reported(self) -> None:
        """The failing rank's report is written: the stopped ranks may end now."""
        if self._store is None or self.failed_first is None:
            return
        with contextlib.suppress(Exception):  # nobody left to tell
            self._store.set(_keys()[1], "1")

    def _watch(self) -> None:
        first, _ = _keys()
        store = _store()  # a client of its own: the main thread's may be in use
        while not self._done.wait(POLL_SECONDS):
            try:
                if not store.check([first]):
                    continue
            except Exception:  # the store's host ended: rank 0's process (under Lightning's launcher or SLURM)
                # Rank 0 ends first at a normal end too: this rank is then about to end as well.
                if self._done.wait(GONE_GRACE_SECONDS) or self.failed_first is not None:
                    return
                self._stop(store, gone=True)
                return
            if store.get(first).decode().split("\t", 1)[0] != str(self.rank):  # not this rank's own word
                self._stop(store)
            return

    def _stop(self, store: dist.TCPStore | None = None, gone: bool = False) -> None:
        """Say why this rank stops, wait for the failing rank's report, and end the process."""
        if not self._stopping.acquire(blocking=False):  # the watch and this rank's own consequent error: one line
            threading.Event().wait()  # the first caller ends the process
        store = store or self._store
        if gone:
            line = f"rank {self.rank} stopped: rank 0 of the job is gone"
        else:
            first, reported = _keys()
            rank, reason = store.get(first).decode().split("\t", 1)
            line = f"rank {self.rank} stopped: rank {rank} failed ({reason}); its error line says what to do"
        with contextlib.suppress(OSError):  # stderr gone with the terminal or the launcher: the stop must go on
            print(line, file=sys.stderr, flush=True)
        if not gone:
            try:
                store.wait([reported], REPORT_WAIT)
                time.sleep(GRACE_SECONDS)
            except Exception:  # no report within the wait, or the store went with its host: end anyway
                pass
        with contextlib.suppress(OSError):
            sys.stdout.flush()
        os._exit(STOPPED)  # the main thread is blocked in a collective that will never complete
