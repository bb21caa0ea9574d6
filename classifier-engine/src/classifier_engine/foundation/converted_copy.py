"""A folder made once from a source and read by every run after: the converted CIFAR archive, the packed images.

Every such copy keeps one protocol, so that a kill, a full disk, a second process or a stray write
never hands a run half a copy:

- one maker at a time: a lock (``file_lock``) on a hidden ``.<name>.lock`` beside the copy (two jobs, or several
  nodes on a shared disk); holding it also makes any temporary left beside the copy a stale one;
- reuse: a copy whose marker (``meta.json``) is there and whose every file still has the size and
  CRC-32 the marker recorded is read as it is; one whose files changed is made anew;
- build: into a temporary folder beside the final one (``files.Partial``), the marker written last
  with the record of every file, renamed into place only when complete;
- a folder this process cannot write is only read, with no lock (``writable``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import file_lock
from .files import Partial, damage, file_record, remove_stale_partials

MARKER = "meta.json"


@dataclass(frozen=True)
class SplitArrays:
    """Where a copy keeps one split: ``<split>_images.npy`` (N, 3, S, S) uint8 and ``<split>_labels.npy`` (N,) int64."""

    images: Path
    labels: Path

    @classmethod
    def in_folder(cls, folder: Path, split: str) -> SplitArrays:
        return cls(folder / f"{split}_images.npy", folder / f"{split}_labels.npy")


@dataclass(frozen=True)
class ConvertedCopy:
    """The copy in ``folder``; ``lock_name`` names its lock when several copies share one (default: the folder's)."""

    folder: Path
    lock_name: str | None = None

    def marker(self) -> dict[str, Any] | None:
        """What the maker recorded, or None where the copy is incomplete or absent."""
        try:
            return json.loads((self.folder / MARKER).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def damage(self, marker: dict[str, Any]) -> str | None:
        """What changed in the copy's files since they were made, or None (copies of earlier releases: sizes only)."""
        records = marker.get("files") or {name: {"bytes": size} for name, size in marker.get("file_sizes", {}).items()}
        return damage(self.folder, records)

    def whole(self) -> dict[str, Any] | None:
        """The marker of a complete copy whose files are as they were made, else None."""
        marker = self.marker()
        return marker if marker is not None and self.damage(marker) is None else None

    @contextmanager
    def making(self, *also_stale: str) -> Iterator[None]:
        """Hold the copy's lock (waiting for another maker to finish), with the stale temporaries removed.

        ``also_stale``: other names whose temporaries this lock guards (the CIFAR archive beside its cache).
        """
        parent = self.folder.parent
        parent.mkdir(parents=True, exist_ok=True)
        with open(parent / f".{self.lock_name or self.folder.name}.lock", "w") as lock:
            file_lock.lock(lock.fileno())
            for name in (self.folder.name, *also_stale):
                remove_stale_partials(parent, f"*.{name}")
            yield

    def build(self, write: Callable[[Path], dict[str, Any]], needed: int | None = None) -> dict[str, Any]:
        """Make the copy: ``write(folder)`` fills a new temporary folder and returns the marker's content.

        ``needed``: the bytes the copy takes, if known (a full disk's message says it). Returns the marker.
        """
        with Partial(self.folder, needed=needed) as partial:
            partial.mkdir()
            marker = write(partial)
            marker["files"] = {path.name: file_record(path) for path in sorted(partial.iterdir()) if path.is_file()}
            (partial / MARKER).write_text(json.dumps(marker, indent=2, ensure_ascii=False), encoding="utf-8")
        return marker
