"""How long each process of a run lives: a started rank, its loader workers and the fork server between them.

One module for every rule, so that none of them hides in a class a user inherits:

- a rank started by a launcher (Lightning's, torchrun) exits when its launcher dies, unless it is ending with
  its own report (``exit_when_launcher_dies``, ``ending_on_its_own``): otherwise the other ranks block in
  their next all-reduce until the process group's timeout (30 minutes in the DDP preset), holding their GPUs;
- a loader worker leaves Ctrl-C and SIGUSR1/2 to its rank, ends when its rank ends, and prints no stray
  error (``start_worker``);
- under a process group, workers start from a single-threaded fork server rather than by ``fork``
  (``worker_context``), and each closes its copy of the server's "alive" pipe so that the server ends with
  the rank.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from multiprocessing.context import BaseContext
from types import TracebackType

PARENT_CHECK_SECONDS = 1.0  # how soon a loader worker notices that its rank (or fork server) is gone
POLL_SECONDS = 0.5  # how soon a started rank notices that its launcher is gone
LAUNCHER_GONE = 1  # the exit code of a rank whose launcher died
_ending_itself = threading.Event()


def ending_on_its_own() -> None:
    """This rank is ending with its own report (it failed first): its launcher's end no longer stops it."""
    _ending_itself.set()


def exit_when_launcher_dies() -> None:
    """Watch the parent of a launched rank (``LOCAL_RANK`` set at start); do nothing for a process started by hand."""
    if "LOCAL_RANK" not in os.environ:
        return
    launcher = os.getppid()

    def watch() -> None:
        while os.getppid() == launcher:
            time.sleep(POLL_SECONDS)
        if _ending_itself.is_set():
            return
        rank = os.environ.get("RANK", os.environ["LOCAL_RANK"])
        with contextlib.suppress(OSError):  # the launcher's end may have closed the pipe; the exit must follow
            print(f"error: the launcher of rank {rank} (pid {launcher}) is gone; this rank stops too", file=sys.stderr)
        os._exit(LAUNCHER_GONE)

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


def start_worker(worker_id: int) -> None:
    """Ready a loader worker: it leaves signals to the main process, ends when its rank does, prints no stray error."""
    leave_signals_to_the_main_process()
    end_with_the_rank()
    sys.excepthook = log_stray_error


def log_stray_error(kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
    """A loader worker's errors outside its loop go to the log at debug level, not the screen.

    The loop's own errors reach the training process, which names them in its one line. What else a
    worker prints comes from its helper threads as it ends with its rank: multiprocessing handing a
    batch's shared memory to a training process that has gone (its connection reset), a store client
    calling into a closed event loop.
    """
    logging.getLogger(__name__).debug("loader worker", exc_info=(kind, error, trace))


def leave_signals_to_the_main_process() -> None:
    """A loader worker ignores Ctrl-C and SIGUSR1/2, which a terminal or a scheduler sends to every process.

    The main process stops at a batch boundary (``StopOnSignal``) and ends its workers itself; a
    worker killed by the signal would fail the validation that may still run before the stop.
    SIGTERM keeps its default: it is how the loader (and multiprocessing at exit) ends a worker.
    """
    for number in (signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(number, signal.SIG_IGN)


def end_with_the_rank() -> None:
    """End this loader worker, and a fork server (``worker_context``) that started it, when its rank ends.

    PyTorch's worker exits once its parent is gone; a fork server's workers have the server as
    parent, and the server exits once every copy of its "alive" pipe is closed. It hands a copy to
    every worker, so a rank killed outright (SIGKILL, the kernel's OOM killer) left the server and
    its workers waiting for each other, holding memory, forever. The worker closes its copy.
    multiprocessing has no public route to that pipe: its private attribute, checked by
    tests/test_private_routes.py.
    """
    from multiprocessing import forkserver

    server = forkserver._forkserver
    if server._forkserver_alive_fd is not None:
        os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None
    # PyTorch's worker checks its parent between batches only; one waiting for data that will not come (a
    # stream's chunk from a store that went away with the rank's fault) would outlive the rank by minutes,
    # holding its memory and the terminal's output open. A thread ends it once the parent is gone.
    parent = os.getppid()

    def exit_when_orphaned() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_SECONDS)
        os._exit(0)

    threading.Thread(target=exit_when_orphaned, name="end-with-the-rank", daemon=True).start()


def worker_context(num_workers: int, world_size: int, *served: object) -> BaseContext | None:
    """How loader workers start (None: as Python's default), from a fork server in place of fork in a process group.

    A process group's threads (gloo's, NCCL's) enter Python without its lock to release tensors,
    and a worker forked at that moment on Python 3.11 deadlocks inside ``fork`` (the
    interpreter's thread-list lock is inherited held); the rank then waits for its batch forever.
    A fork server is a single-threaded process that forks the workers instead, with the modules of
    ``served`` (the dataset, collate and init functions) imported once.
    """
    if num_workers == 0 or world_size <= 1 or multiprocessing.get_context().get_start_method() != "fork":
        return None  # one process, or workers that are not forked (spawn on macOS, forkserver from Python 3.14)
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(sorted({"torch", *(getattr(item, "__module__", "torch") for item in served)}))
    return context
