"""``<run>/logs/error.log``: the full story of a run that ended in an error, for whoever has to fix it.

The screen gets one line (``faults.py``); this file gets the traceback of each rank that failed
and what the machine looked like: versions, devices and their memory, free disk where the run
writes, free host memory, the command line, and after a CUDA out-of-memory error the allocator's
own summary. Each failing rank appends its own block. Writing it must never hide the error it
reports: whatever fails here is noted in the block, or the file is given up.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

import lightning
import torch

from ..runs.console_log import logs_dir


def error_file(run_dir: Path) -> Path:
    return logs_dir(run_dir) / "error.log"


def _megabytes(count: float) -> str:
    return f"{count / 2**20:,.0f} MB"


def _host_memory() -> str:
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        available, total = (int(fields[key].split()[0]) * 1024 for key in ("MemAvailable", "MemTotal"))
        return f"{_megabytes(available)} available of {_megabytes(total)}"
    except (OSError, KeyError, ValueError):
        return "unknown (no /proc/meminfo)"


def _driver() -> str:
    if shutil.which("nvidia-smi") is None:
        return "no nvidia-smi"
    try:
        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        result = subprocess.run(query, capture_output=True, text=True, timeout=10)
        return result.stdout.strip().splitlines()[0] if result.returncode == 0 and result.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _devices() -> list[str]:
    if not torch.cuda.is_available():
        return ["devices: CPU only (no CUDA device)"]
    lines = []
    for index in range(torch.cuda.device_count()):
        name = torch.cuda.get_device_name(index)
        try:
            free, total = torch.cuda.mem_get_info(index)
            memory = f"{_megabytes(free)} free of {_megabytes(total)}"
        except RuntimeError as error:  # a device in a bad state after the error
            memory = f"memory unknown ({str(error).splitlines()[0]})"
        allocated = torch.cuda.memory_allocated(index)
        lines.append(f"cuda:{index}: {name}, {memory}, {_megabytes(allocated)} allocated by this process")
    return lines


def environment(run_dir: Path) -> list[str]:
    """What the machine looked like when the error happened, a line per fact."""
    try:
        disk = shutil.disk_usage(run_dir if Path(run_dir).exists() else Path.cwd())
        free_disk = f"{_megabytes(disk.free)} free of {_megabytes(disk.total)} at {run_dir}"
    except OSError as error:
        free_disk = f"unknown ({error.strerror})"
    return [
        f"command: {' '.join([sys.executable, *sys.argv])}",
        f"working folder: {Path.cwd()}",
        f"python {platform.python_version()} on {platform.platform()}",
        f"torch {torch.__version__}, lightning {lightning.__version__}, CUDA {torch.version.cuda or 'none'}, "
        f"cuDNN {torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else 'none'}, "
        f"driver {_driver()}",
        *_devices(),
        f"disk: {free_disk}",
        f"host memory: {_host_memory()}",
        f"rank: {os.environ.get('RANK', os.environ.get('LOCAL_RANK', '0'))}, pid {os.getpid()}",
    ]


def write_error_log(run_dir: Path, error: BaseException, headline: str) -> tuple[Path | None, str]:
    """Append this rank's block (the one line, the traceback, the environment) to the run's error.log.

    Returns the file (None if there is none) and, if it could not be written whole (a full disk), why:
    the one line must still be printed.
    """
    parts = [f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} {headline}", ""]
    parts += traceback.format_exception(error)
    parts += ["", "---- environment"]
    try:
        parts += environment(run_dir)
    except Exception as failure:  # the report is best effort; the traceback above is what matters
        parts.append(f"(environment not read: {failure!r})")
    if isinstance(error, torch.OutOfMemoryError) and torch.cuda.is_available():
        parts += ["", "---- torch.cuda.memory_summary()"]
        try:
            parts += [torch.cuda.memory_summary(abbreviated=True)]
        except Exception as failure:
            parts.append(f"(not available: {failure!r})")
    text = "\n".join(part.rstrip("\n") for part in parts) + "\n\n"
    path = error_file(run_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as file:
            file.write(text)
    except OSError as failure:
        return (path if path.is_file() else None), failure.strerror or str(failure)
    return path, ""
