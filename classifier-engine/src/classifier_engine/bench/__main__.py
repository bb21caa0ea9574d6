"""``python -m classifier_engine.bench NAME [options]``: run one benchmark on the project in the current folder."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
NAMES = sorted(path.stem.removeprefix("bench_") for path in HERE.glob("bench_*.py"))


def main(argv: list[str]) -> int:
    choices = [*NAMES, "gpu_figures"]
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m classifier_engine.bench {" + ",".join(choices) + "} [options]\n" + (__doc__ or ""))
        return 0 if argv else 2
    if argv[0] not in choices:
        print(f"error: {argv[0]!r} is not a benchmark; choose one of {', '.join(choices)}", file=sys.stderr)
        return 2
    if argv[0] == "gpu_figures":
        return subprocess.call(["bash", str(HERE / "gpu_figures.sh"), *argv[1:]])
    sys.argv = [f"python -m classifier_engine.bench {argv[0]}", *argv[1:]]
    runpy.run_module(f"{__package__}.bench_{argv[0]}", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
