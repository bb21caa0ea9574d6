"""All of an export's files, or none: written under temporary names, renamed together once every check passed.

A deployment picks up ``model.onnx`` and ``model.card.json`` as a pair; a half-finished export
(a failed check, a kill, a full disk) must not leave a new model beside an old card, a file that
no check has seen, or a folder the export made for nothing. The temporary names live in the
output folder itself, so the final renames never cross a filesystem.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType

from ..foundation.files import NewFolders, Partial, remove_stale_partials


class StagedFiles:
    """``with StagedFiles(folder) as staged: path = staged.path("model.onnx"); ...; staged.commit()``.

    Leaving the block without ``commit()`` removes every temporary file and every folder the
    block created; files already in ``folder`` are never touched until ``commit()`` replaces them.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self._staged: dict[str, Partial] = {}
        self._new_folders = NewFolders(self.folder)
        self._committed = False

    def __enter__(self) -> StagedFiles:
        self._new_folders.make()
        remove_stale_partials(self.folder)  # one export per folder at a time
        return self

    def path(self, name: str) -> Path:
        """Where to write the file that becomes ``folder/name`` on commit."""
        self._staged[name] = Partial(self.folder / name)
        return self._staged[name].path

    def drop(self, name: str) -> None:
        """Leave ``folder/name`` out of the commit (a file built but not to be shipped); its temporary is removed."""
        self._staged.pop(name).discard()

    def commit(self) -> list[Path]:
        """Rename every staged file to its final name; returns the final paths."""
        finals = [staged.commit() for staged in self._staged.values()]
        self._committed = True
        return finals

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._committed:
            return
        for staged in self._staged.values():
            staged.discard()
            Path(f"{staged.path}.data").unlink(missing_ok=True)  # an exporter's external weights, if any
        self._new_folders.remove()
