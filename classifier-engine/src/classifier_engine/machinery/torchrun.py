"""torchrun as ``scripts/torchrun.sh`` starts it, with a failed job summed up in one line.

torchrun's agent already does the right thing when a rank fails: it stops the others and exits
non-zero. It then prints its own report, a traceback and a box per rank, after the ranks have said
in one line each which one failed and why (``rank_failure.py``). This keeps torchrun whole (the
same options, the same agent, the same exit status) and replaces that report with one line.

    python -m classifier_engine.torchrun [torchrun's options] main.py fit ...
"""

from __future__ import annotations

import sys

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import main as torchrun

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


if __name__ == "__main__":  # the path scripts of projects rendered before 1.6 run
    print(
        "warning: python -m classifier_engine.machinery.torchrun is private and goes in 1.7; run "
        "python -m classifier_engine.torchrun (the same options)",
        file=sys.stderr,
    )
    sys.exit(main())
