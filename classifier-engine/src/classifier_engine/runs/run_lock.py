"""One process trains a run: ``<run>/run.lock`` is held (``foundation/file_lock.py``) by it and names it.

The lock is an advisory lock on the file (``flock``, or ``msvcrt`` on Windows), which the system releases
when the holder dies,
however it dies: a lock file left behind by ``kill -9`` is simply taken by the next ``fit``, with
no prompt and no pid guessing. The file's text (pid and host) only serves to name the holder
when a second ``fit`` of the same run is refused. It is removed when the holder ends.
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

from ..foundation import file_lock
from ..foundation.errors import UsageError

LOCK_FILENAME = "run.lock"


class RunLock:
    """The held lock of one run directory (which must exist)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK_FILENAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise a ``UsageError`` naming the process that holds it."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            if not file_lock.lock(fd, wait=False):
                try:
                    holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
                except OSError:  # (Windows: the holder's locked byte cannot be read)
                    holder = "another process"
                os.close(fd)
                raise UsageError(
                    f"{self.path.parent} is being trained by {holder} ({self.path}); wait for it to end or stop "
                    "it, then resume with --ckpt_path last"
                ) from None
            try:
                same_file = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:  # its holder ended and removed it between our open and lock
                same_file = False
            if same_file:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        # While still held, so no one locks a file about to vanish (Windows removes no open file: it stays).
        with contextlib.suppress(OSError):
            self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None
