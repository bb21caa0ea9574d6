"""How this process was launched: whether it is rank 0, and leaving the process group in step at the end.

Stopping when the launcher dies is ``foundation/process_lifetime.py``'s, with every other rule of how long
a process of a run lives.
"""

from __future__ import annotations

import os


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
