"""All of an export's files, or none: written under temporary names, renamed together once every check passed.

A deployment picks up ``model.onnx`` and ``model.card.json`` as a pair; a half-finished export
(a failed check, a kill, a full disk) must not leave a new model beside an old card, a file that
no check has seen, or a folder the export made for nothing. The temporary names live in the
output folder itself, so the final renames never cross a filesystem.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType

PARTIAL_MARKER = ".partial-"  # a hidden name: .partial-<pid>.<final name>


class StagedFiles:
    """``with StagedFiles(folder) as staged: path = staged.path("model.onnx"); ...; staged.commit()``.

    Leaving the block without ``commit()`` removes every temporary file and every folder the
    block created; files already in ``folder`` are never touched until ``commit()`` replaces them.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self._staged: dict[str, Path] = {}
        self._created: list[Path] = []
        self._committed = False

    def __enter__(self) -> StagedFiles:
        missing = [p for p in [self.folder, *self.folder.parents] if not p.exists()]
        for folder in reversed(missing):
            folder.mkdir()
            self._created.append(folder)
        self._remove_stale_partials()
        return self

    def path(self, name: str) -> Path:
        """Where to write the file that becomes ``folder/name`` on commit."""
        # The final name stays the suffix: readers that insist on ".pt2" or ".onnx" accept the staged file too.
        staged = self.folder / f"{PARTIAL_MARKER}{os.getpid()}.{name}"
        self._staged[name] = staged
        return staged

    def final(self, name: str) -> Path:
        return self.folder / name

    def commit(self) -> list[Path]:
        """Rename every staged file to its final name; returns the final paths."""
        finals = []
        for name, staged in self._staged.items():
            os.replace(staged, self.folder / name)
            finals.append(self.folder / name)
        self._committed = True
        return finals

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._committed:
            return
        for staged in self._staged.values():
            staged.unlink(missing_ok=True)
            Path(f"{staged}.data").unlink(missing_ok=True)  # an exporter's external weights, if any
        for folder in reversed(self._created):
            try:
                folder.rmdir()
            except OSError:  # someone else put a file there meanwhile: theirs, not ours
                break

    def _remove_stale_partials(self) -> None:
        """Temporary files of an export that was killed (another process id than this one)."""
        own = f"{PARTIAL_MARKER}{os.getpid()}."
        for stale in self.folder.glob(f"{PARTIAL_MARKER}*"):
            if not stale.name.startswith(own) and stale.is_file():
                stale.unlink(missing_ok=True)
