"""The library's documentation, installed with it: ``python -m classifier_engine.docs [PAGE]``.

A project's own docs link here rather than copy these pages, so what a user reads is the behaviour of the
version installed in their environment.
"""

from __future__ import annotations

from pathlib import Path

FOLDER = Path(__file__).resolve().parent


def pages() -> dict[str, Path]:
    """Every page by name (its file name without ``.md``)."""
    return {path.stem: path for path in sorted(FOLDER.glob("*.md")) if path.name != "README.md"}


def title(path: Path) -> str:
    """The page's first heading."""
    headings = [line[2:].strip() for line in path.read_text().splitlines() if line.startswith("# ")]
    return headings[0] if headings else path.stem
