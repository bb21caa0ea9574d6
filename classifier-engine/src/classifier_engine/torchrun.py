"""``python -m classifier_engine.torchrun [torchrun's options] main.py fit ...``: torchrun, a failed job in one line.

Public, like ``classifier_engine.testing``: a project's ``scripts/torchrun.sh`` and its cluster page start
multi-process and multi-node jobs with it (``machinery/torchrun.py`` says what it changes of torchrun).
"""

from __future__ import annotations

import sys

from .machinery.torchrun import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
