"""How this process was launched: whether it is rank 0, and, for a started rank, stopping when its launcher dies.

Lightning's launcher (``--trainer.devices N``) and torchrun start the ranks as child processes
and set ``LOCAL_RANK`` for them. If the launcher is killed (SIGKILL, an out-of-memory kill), the
other ranks would block in their next all-reduce until the process group's timeout (30 minutes in
the DDP preset), holding their GPUs. A started rank therefore watches its parent: once it is gone
(the rank has been re-parented), the rank exits, and its loader workers follow it (PyTorch's
workers exit when their parent does).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

POLL_SECONDS = 0.5
LAUNCHER_GONE = 1
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


def launched_as_rank_zero() -> bool:
    """Whether this process is global rank 0, from what launchers set before the trainer exists.

    Lightning's launcher gives its ranks ``LOCAL_RANK`` (and each node ``NODE_RANK``), torchrun
    ``RANK``, SLURM ``SLURM_PROCID``.
    """
    for variable in ("RANK", "SLURM_PROCID"):
        if variable in os.environ:
            return int(os.environ[variable]) == 0
    return int(os.environ.get("LOCAL_RANK", 0)) == 0 and int(os.environ.get("NODE_RANK", 0)) == 0


def leave_the_process_group() -> None:
    """End this rank's process group while Python still runs, once every rank has ended the command in step.

    Lightning destroys only NCCL's group at exit. A gloo group left to the end has threads that
    still release finished collectives' tensors, which takes Python's lock; one that does so while
    the interpreter shuts down is stopped inside a C++ destructor and the process aborts
    ("terminate called without an active exception"), turning a clean stop into SIGABRT.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
