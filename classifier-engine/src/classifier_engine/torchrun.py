"""``python -m classifier_engine.torchrun [torchrun's options] main.py fit ...``: torchrun, a failed job in one line.

Public, like ``classifier_engine.testing``: a project's ``scripts/torchrun.sh`` and its cluster page start
multi-process and multi-node jobs with it. torchrun's agent already does the right thing when a rank fails: it
stops the others and exits non-zero. It then prints its own report, a traceback and a box per rank, after the
ranks have said in one line each which one failed and why (``faults/rank_failure.py``). This keeps torchrun whole
(the same options, the same agent, the same exit status) and replaces that report with one line.
"""

from __future__ import annotations

import sys

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import main as torchrun

__all__ = ["main"]

FAILED = 1


def main(argv: list[str] | None = None) -> int:
    try:
        torchrun(argv)
    except ChildFailedError as error:
        ranks = ", ".join(str(rank) for rank in sorted(error.failures))
        print(
            f"torchrun: the job ended: rank(s) {ranks} exited non-zero; the ranks' own lines above say which "
            "failed first and how to continue",
            file=sys.stderr,
        )
        return FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
