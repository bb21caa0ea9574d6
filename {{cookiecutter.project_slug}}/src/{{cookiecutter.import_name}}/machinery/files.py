"""Files that are complete or absent, and folders that outlive only the work that succeeded.

Every writer a kill, a full disk or a failed check could interrupt (checkpoints, the data
download and cache, predictions, exports) goes through ``Partial``: the bytes go to a hidden
temporary name in the target's own folder (so the final rename never crosses a filesystem and
is never a copy), are fsynced, and replace the target with one ``os.replace``. Every start that
may create folders and then fail (a run, a data folder, an export folder) goes through
``NewFolders``, which removes exactly the folders it made.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import TracebackType

PARTIAL_PREFIX = ".partial-"  # .partial-<pid>.<final name>: hidden, and the final suffix is kept


class Partial:
    """A file or folder written at ``path`` and renamed over ``target`` by ``commit()``; ``discard()`` drops it.

    ``with Partial(target) as path:`` commits when the block succeeds and discards when it raises;
    a writer that spans several hooks calls ``commit()`` or ``discard()`` itself.
    """

    def __init__(self, target: str | os.PathLike) -> None:
        self.target = Path(target)
        # The final name stays the suffix: readers that insist on ".onnx" or ".pt2" accept the temporary too.
        self.path = self.target.with_name(f"{PARTIAL_PREFIX}{os.getpid()}.{self.target.name}")

    def commit(self) -> Path:
        """Make the written bytes durable and put them in the target's place; returns the target."""
        _fsync_tree(self.path)
        if self.path.is_dir() and self.target.is_dir():
            shutil.rmtree(self.target)  # a folder cannot be renamed over a non-empty one
        os.replace(self.path, self.target)
        _fsync(self.target.parent)  # the rename itself
        return self.target

    def discard(self) -> None:
        _remove(self.path)

    def __enter__(self) -> Path:
        return self.path

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if kind is None:
            self.commit()
        else:
            self.discard()


def remove_stale_partials(folder: Path, pattern: str = "*") -> None:
    """Delete the temporaries of writers that are gone (another process id) in ``folder``.

    Only for folders a single process writes at a time (a run's checkpoints, a locked data folder,
    an export folder): a concurrent writer's temporary would be taken for a stale one.
    """
    own = f"{PARTIAL_PREFIX}{os.getpid()}."
    for stale in folder.glob(f"{PARTIAL_PREFIX}{pattern}"):
        if not stale.name.startswith(own):
            _remove(stale)


class NewFolders:
    """``path`` and the parents it lacks: made by ``make()``, removed again (and only they) by ``remove()``.

    ``with NewFolders(path):`` removes them when the block raises.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        missing = [folder for folder in [self.path, *self.path.parents] if not folder.exists()]
        self.topmost: Path | None = missing[-1] if missing else None  # None: the folder exists already

    def make(self) -> Path:
        self.path.mkdir(parents=True, exist_ok=True)
        return self.path

    def remove(self) -> None:
        if self.topmost is not None:
            shutil.rmtree(self.topmost, ignore_errors=True)

    def __enter__(self) -> Path:
        return self.make()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if kind is not None:
            self.remove()


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _fsync_tree(path: Path) -> None:
    for file in [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]:
        _fsync(file)


def _fsync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
