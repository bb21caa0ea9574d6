"""One process trains a run: ``<run>/run.lock`` is held (``filelock``) by it and names it.

The lock is an advisory lock on the file (``flock`` on POSIX, ``msvcrt`` on Windows), which the
system releases when the holder dies, however it dies: a lock file left behind by ``kill -9`` is
simply taken by the next ``fit``, with no prompt and no pid guessing. The file's text (pid and host)
only serves to name the holder when a second ``fit`` of the same run is refused. It is removed when
the holder ends.
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

from filelock import FileLock, Timeout

from ..foundation.errors import UsageError

LOCK_FILENAME = "run.lock"


class RunLock:
    """The held lock of one run directory (which must exist)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK_FILENAME
        self._lock: FileLock | None = None

    def acquire(self) -> None:
        """Take the lock, or raise a ``UsageError`` naming the process that holds it."""
        lock = FileLock(self.path, timeout=0)
        try:
            lock.acquire()
        except Timeout:
            try:
                holder = self.path.read_text(errors="replace").strip()
            except OSError:  # (Windows locks the bytes it holds)
                holder = ""
            raise UsageError(
                f"{self.path.parent} is being trained by {holder or 'another process'} ({self.path}); wait for it to "
                "end or stop it, then resume with --ckpt_path last"
            ) from None
        with open(self.path, "w", encoding="utf-8") as note:
            note.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        self._lock = lock

    def release(self) -> None:
        if self._lock is None:
            return
        # While still held, so no one locks a file about to vanish (Windows does not remove a file that is open).
        with contextlib.suppress(OSError):
            self.path.unlink(missing_ok=True)
        self._lock.release()
        self._lock = None
