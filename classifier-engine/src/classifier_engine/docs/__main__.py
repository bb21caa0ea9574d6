"""``python -m classifier_engine.docs``: the pages; ``... docs PAGE``: one page's text; ``--path``: its file."""

from __future__ import annotations

import argparse
import sys

from . import pages, title


def main() -> None:
    known = pages()
    parser = argparse.ArgumentParser(prog="python -m classifier_engine.docs", description=__doc__)
    parser.add_argument("page", nargs="?", help=f"one of: {', '.join(known)}")
    parser.add_argument("--path", action="store_true", help="print the page's file instead of its text")
    args = parser.parse_args()
    if args.page is None:
        for name, path in known.items():
            print(f"{name:<10} {title(path)}")
        return
    if args.page not in known:
        parser.exit(2, f"error: no page {args.page!r}; the pages are {', '.join(known)}\n")
    path = known[args.page]
    sys.stdout.write(f"{path}\n" if args.path else path.read_text())


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:  # the reader stopped early (``| head``): nothing left to say
        sys.stderr.close()
