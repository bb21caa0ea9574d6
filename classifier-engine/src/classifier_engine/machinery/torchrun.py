"""What ``scripts/torchrun.sh`` of a project rendered before 1.6 runs: ``classifier_engine.torchrun``, warned."""

from __future__ import annotations

import sys

from ..torchrun import main

if __name__ == "__main__":
    print(
        "warning: python -m classifier_engine.machinery.torchrun is private and goes in 1.7; run "
        "python -m classifier_engine.torchrun (the same options)",
        file=sys.stderr,
    )
    sys.exit(main())
