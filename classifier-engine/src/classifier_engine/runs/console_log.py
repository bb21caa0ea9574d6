"""``<run>/logs/console.log``: everything a run printed, with timestamps, appended across resumes.

A scheduler's output file is rotated, truncated or lost with the job; the run's own copy is not.
What the process prints is teed from the start (``sys.stdout``, ``sys.stderr`` and the logging
handlers that write to them) but held in memory until the session has taken its first optimizer
step, or ends in a fault: a mistake refused before training leaves the disk as it was. Rank 0
writes ``console.log``; other ranks write ``console-rank<N>.log``, only if they print anything.

A progress bar redraws its line with carriage returns: the file keeps the line's last state. On a
terminal, a live display (Lightning's rich progress bar) redraws its last lines by moving the cursor
up: the file drops the lines it redrew (the last few lines wait in memory for that, and are written
when the command ends), and terminal control codes are left out. The file is a copy: if it cannot
be written (a full disk), the screen still gets every line, and the run goes on. A background
thread that fails (TensorBoard's event writer on a full disk) gets one line on the screen; its
traceback goes to the file only.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import logging
import os
import re
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import TextIO

from typing_extensions import override

LOGS = "logs"
CURSOR_UP = re.compile(r"\x1b\[(\d*)A")
CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")  # CSI sequences, OSC titles and links
REDRAWN_LINES = 12  # on a terminal: lines a live display may still move up to and redraw


def logs_dir(run_dir: Path) -> Path:
    return Path(run_dir) / LOGS


def console_file(run_dir: Path, rank: int) -> Path:
    return logs_dir(run_dir) / ("console.log" if rank == 0 else f"console-rank{rank}.log")


class _Tee(io.TextIOBase):
    """A text stream that writes through to ``stream`` and hands each completed line to ``sink``."""

    def __init__(self, stream: TextIO, sink: ConsoleLog) -> None:
        super().__init__()
        self.stream = stream
        self.sink = sink
        self.pending = ""

    @override
    def write(self, text: str) -> int:
        written = self.stream.write(text)
        if "\n" not in text:  # a progress bar redrawing its line: keep only its latest state
            self.pending = (self.pending + text).rstrip("\r").rsplit("\r", 1)[-1]
            return written
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            self.sink.record(line.rstrip("\r").rsplit("\r", 1)[-1])  # a redrawn line: its last state
        return written

    @override
    def flush(self) -> None:
        self.stream.flush()

    @override
    def isatty(self) -> bool:
        return self.stream.isatty()

    @override
    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.stream.encoding

    @override
    def writable(self) -> bool:
        return True


class ConsoleLog:
    """The process's console, copied into its run's ``logs/`` once there is a run worth recording."""

    def __init__(self) -> None:
        self.held: list[str] = []
        self.file: TextIO | None = None
        self.path: Path | None = None
        self.failed: str | None = None  # why the file could not be written, if it could not
        self.tail: list[str] = []  # the last lines, while a live display may still redraw them (terminals only)
        self.redrawn = 0
        self._streams: tuple[TextIO, TextIO] | None = None

    def start(self) -> None:
        """Tee ``sys.stdout``/``sys.stderr`` and the logging handlers that write to them (idempotent)."""
        if self._streams is not None:
            return
        self._streams = (sys.stdout, sys.stderr)
        self.redrawn = REDRAWN_LINES if any(stream.isatty() for stream in self._streams) else 0
        atexit.register(self.close)
        tees = {id(stream): _Tee(stream, self) for stream in self._streams}
        sys.stdout, sys.stderr = tees[id(self._streams[0])], tees[id(self._streams[1])]
        # Lightning's handler (and any other made at import) holds the stream it was given then.
        for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
            for handler in getattr(logger, "handlers", []):
                if type(handler) is logging.StreamHandler and id(handler.stream) in tees:
                    handler.setStream(tees[id(handler.stream)])
        threading.excepthook = self._thread_failed

    def _thread_failed(self, failure: threading.ExceptHookArgs) -> None:
        """One line on the screen for a failed background thread; its traceback in the file only."""
        if failure.exc_type is SystemExit:
            return
        text = "".join(traceback.format_exception(failure.exc_type, failure.exc_value, failure.exc_traceback))
        name = failure.thread.name if failure.thread is not None else "a thread"
        for line in [f"background thread {name} failed:", *text.splitlines()]:
            self.record(line)
        where = f" (traceback in {self.path})" if self.path is not None and self.failed is None else ""
        message = str(failure.exc_value).splitlines()[0] if str(failure.exc_value) else ""
        warning = f"warning: background thread {name} failed: {failure.exc_type.__name__}: {message}{where}"
        self._streams[1].write(warning + "\n")

    def record(self, line: str) -> None:
        """Keep one printed line (without its terminal codes); a line that moves the cursor up replaces lines."""
        up = sum(int(count or 1) for count in CURSOR_UP.findall(line))
        if up:
            del self.tail[max(len(self.tail) - up, 0) :]
        self.tail.append(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {CONTROL.sub('', line)}\n")
        while len(self.tail) > self.redrawn:
            self._keep(self.tail.pop(0))

    def _keep(self, stamped: str) -> None:
        if self.path is None:
            self.held.append(stamped)
        elif self._open():
            self._write(stamped)

    def attach(self, run_dir: Path, rank: int) -> Path | None:
        """Write what was held to the run's console file and append there from now on; its path.

        Rank 0's file is opened now; another rank's at its first line. None: the file cannot be written
        (``failed`` says why; the screen still has every line).
        """
        if self._streams is None:  # not started: in-process use (a notebook, a test), where the caller has the output
            return None
        if self.path is None:
            self.path = console_file(run_dir, rank)
        if (rank == 0 or self.held) and not self._open():
            return None
        return self.path

    def _open(self) -> bool:
        if self.file is not None:
            return True
        if self.failed is not None:
            return False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (open for the process's life)
        except OSError as error:
            self.failed = f"{self.path}: {error.strerror}"
            self.held = []
            return False
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        held, self.held = self.held, []
        for line in [f"{stamp} ---- {' '.join(sys.argv)} (pid {os.getpid()})\n", *held]:
            self._write(line)
        return self.file is not None

    def _write(self, line: str) -> None:
        try:
            self.file.write(line)
            self.file.flush()
        except OSError as error:  # a full disk: the screen still has it; the run goes on
            self.failed = f"{self.path}: {error.strerror}"
            self._close_file()

    def discard(self) -> None:
        """Forget what was held: the session left nothing worth recording (a refused start)."""
        self.held, self.tail = [], []

    def detach(self) -> None:
        """End this run's copy (the next command in this process, a sweep's next trial, starts its own)."""
        self.close()
        self.path, self.failed, self.held, self.tail = None, None, [], []

    def close(self) -> None:
        """Write the lines no display can redraw any more, and close the file."""
        tail, self.tail = self.tail, []
        for line in tail:
            self._keep(line)
        self._close_file()

    def _close_file(self) -> None:
        if self.file is not None:
            with contextlib.suppress(OSError):  # the last lines could not be flushed: the screen has them
                self.file.close()
            self.file = None


CONSOLE = ConsoleLog()  # one per process: the streams it tees are the process's
