"""Files that are complete or absent, and folders that outlive only the work that succeeded.

Every writer a kill, a full disk or a failed check could interrupt (checkpoints, the data
download and cache, predictions, exports) goes through ``Partial``: the bytes go to a hidden
temporary name in the target's own folder (so the final rename never crosses a filesystem and
is never a copy), are fsynced, and replace the target with one ``os.replace``. Every start that
may create folders and then fail (a run, a data folder, an export folder) goes through
``NewFolders``, which removes exactly the folders it made.

A copy made once and read by every run (the converted archive, packed images) records each file's
size and CRC-32 when it is made (``file_record``); ``damage`` says what changed since, before a run
trains on it: a truncation (a full disk, a crash) or bytes overwritten.

A full disk is reported as ``NoSpaceError``, whatever the writer said: Python's ``OSError(ENOSPC)``,
or torch's C++ writer's ``unexpected pos N vs M`` and ``basic_ios::clear`` (its file is closed for it).
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import zlib
from pathlib import Path
from types import TracebackType

from .errors import UserError

PARTIAL_PREFIX = ".partial-"  # .partial-<pid>.<final name>: hidden, and the final suffix is kept


FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# What torch's zip writer (C++) says when a write comes up short; on its own it may mean another failure.
TORCH_SHORT_WRITE = ("unexpected pos", "basic_ios::clear", "file write failed", "PytorchStreamWriter failed writing")
NEARLY_FULL = 4 * 2**20  # bytes: less than this left after a short write means the disk filled up


def megabytes(count: float) -> str:
    return f"{count / 2**20:,.1f} MB"


class NoSpaceError(UserError):
    """A file could not be written for lack of space; nothing of it was kept."""

    def __init__(self, target: Path, needed: int | None, free: int, remedy: str = "") -> None:
        """``remedy``: what to do besides freeing space (said after it), e.g. where else to write."""
        self.target, self.needed, self.free, self.remedy = Path(target), needed, free, remedy
        need = f"needs about {megabytes(needed)}, " if needed else ""
        where = f"the disk of {self.target.parent}"
        message = (
            f"no space left on {where} to write {self.target.name} ({need}{megabytes(free)} free; nothing was kept)"
        )
        super().__init__(f"{message}; free space there or {remedy}" if remedy else message)


def free_bytes(folder: Path) -> int:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return 0


def is_full_disk(error: BaseException, folder: Path, needed: int | None = None) -> bool:
    """Whether ``error`` of a writer into ``folder`` means the disk (or the quota) is full."""
    if isinstance(error, NoSpaceError):
        return True
    if isinstance(error, OSError):
        return error.errno in FULL_DISK_ERRNOS
    if isinstance(error, RuntimeError) and any(text in str(error) for text in TORCH_SHORT_WRITE):
        free = free_bytes(folder)
        return free < NEARLY_FULL or (needed is not None and free < needed)
    return False


class Partial:
    """A file or folder written at ``path`` and renamed over ``target`` by ``commit()``; ``discard()`` drops it.

    ``with Partial(target) as path:`` commits when the block succeeds and discards when it raises;
    a writer that spans several hooks calls ``commit()`` or ``discard()`` itself.
    """

    def __init__(self, target: str | os.PathLike, needed: int | None = None) -> None:
        """``needed``: the bytes the file will take, if known (a full disk's message says it)."""
        self.target = Path(target)
        self.needed = needed
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
            try:
                self.commit()
            except OSError as failure:
                self.discard_after(failure)
                raise
        else:
            self.discard_after(error)

    def discard_after(self, error: BaseException) -> None:
        """Drop what was written after ``error`` of the writer; a full disk is raised as ``NoSpaceError``."""
        self._raise_if_full(error)
        self.discard()

    def _raise_if_full(self, error: BaseException) -> None:
        """Turn a full disk into ``NoSpaceError`` (judged before the discard gives the space back)."""
        if isinstance(error, NoSpaceError):
            return
        if is_full_disk(error, self.target.parent, self.needed):
            self.discard()
            raise NoSpaceError(self.target, self.needed, free_bytes(self.target.parent)) from error


CHECKSUM_CHUNK = 16 * 2**20


def file_record(path: Path) -> dict[str, int]:
    """``{"bytes": size, "crc32": checksum}`` of a file: what ``damage`` compares later (CRC-32 reads ~2 GB/s)."""
    checksum = 0
    with open(path, "rb") as file:
        while chunk := file.read(CHECKSUM_CHUNK):
            checksum = zlib.crc32(chunk, checksum)
    return {"bytes": Path(path).stat().st_size, "crc32": checksum}


# Files this process found whole, by path, size, modification time and checksum: a command asks about the
# same copy several times (naming the run, preparing, setting up), and need read it only once.
_whole: set[tuple[Path, int, int, int]] = set()


def sha256(path: Path) -> str:
    """The file's SHA-256, read a mebibyte at a time (a checkpoint or a shipped model can be large)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def damage(folder: Path, records: dict[str, dict[str, int]]) -> str | None:
    """What differs in ``folder`` from the ``file_record`` of each file when it was made, or None if nothing."""
    for name, recorded in records.items():
        path = Path(folder) / name
        if not path.is_file():
            return f"{name} is missing"
        stat = path.stat()
        if stat.st_size != recorded["bytes"]:
            return f"{name} has {stat.st_size:,} bytes, {recorded['bytes']:,} when it was made"
        if "crc32" not in recorded:  # a copy of an earlier release: its sizes only
            continue
        known = (path.resolve(), stat.st_size, stat.st_mtime_ns, recorded["crc32"])
        if known not in _whole:
            if file_record(path)["crc32"] != recorded["crc32"]:
                return f"{name} has other bytes than when it was made, by its checksum"
            _whole.add(known)
    return None


def writable(folder: Path) -> bool:
    """Whether this process may create files in ``folder``, or in its nearest existing parent if it is not there yet.

    ``os.access`` knows a read-only filesystem even for root, who passes every permission check.
    """
    existing = next((path for path in [Path(folder), *Path(folder).parents] if path.exists()), Path("."))
    return existing.is_dir() and os.access(existing, os.W_OK | os.X_OK)


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
