"""Checkpoint files that are either complete or absent, whatever kills the process.

Lightning's default writer stages the file in ``$TMPDIR`` and moves it into place; across
filesystems that move is a copy, and a kill during it truncates the previous good
checkpoint. Here the bytes go to a temporary file in the checkpoint's own folder, are
flushed and fsynced, and replace the target with one atomic ``os.replace``. Temporary files
left by a killed writer are removed on the next save into that folder.
"""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io import TorchCheckpointIO
from typing_extensions import override

from ..foundation.files import Partial, remove_stale_partials
from .checkpoint_values import CheckpointError, check_structure


class NonFiniteWeightsError(FloatingPointError):
    """A checkpoint about to be written holds NaN or infinite weights (or buffers): training has diverged."""

    def __init__(self, target: Path, names: list[str], total: int, step: int) -> None:
        self.target, self.names, self.step = target, names, step
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        super().__init__(
            f"the model's state stopped being finite by step {step} ({len(names)} of {total} tensors: {shown})"
        )


def non_finite_weights(state_dict: dict[str, Any]) -> list[str]:
    """The names of the floating-point tensors in ``state_dict`` holding a NaN or an infinity."""
    floating = {
        name: value for name, value in state_dict.items() if torch.is_tensor(value) and value.is_floating_point()
    }
    if not floating:
        return []
    finite = torch.stack([torch.isfinite(value).all().cpu() for value in floating.values()])  # one read per device
    return [name for name, ok in zip(floating, finite.tolist(), strict=True) if not ok]


def tensor_bytes(value: Any) -> int:
    """The bytes of every tensor in a nested checkpoint: about what the file will take."""
    if torch.is_tensor(value):
        return value.untyped_storage().nbytes() if value.device.type != "meta" else 0
    if isinstance(value, dict):
        return sum(tensor_bytes(item) for item in value.values())
    if isinstance(value, list | tuple):
        return sum(tensor_bytes(item) for item in value)
    return 0


class AtomicCheckpointIO(TorchCheckpointIO):
    """Same-folder temporary file, fsync, ``os.replace`` (``files.Partial``); stale temporaries are cleaned up.

    ``written`` maps each file this process completed to the optimizer step it holds, so that a
    stopped run names the checkpoint it really left, never one that failed or was not written.

    Reading goes through ``read_checkpoint`` too, whatever Lightning restores from (a resumed ``fit``,
    ``--ckpt_path hpc``). A command that has read the file already hands its dict over (``hand_over``), so
    the bytes it checked are the bytes Lightning restores; ``fits`` (set once the model is built) checks
    that every tensor has the shape that model expects before Lightning copies anything.
    """

    def __init__(self) -> None:
        super().__init__()
        self.written: dict[Path, int] = {}
        self.handed: tuple[Path, dict[str, Any]] | None = None
        self.fits: Callable[[dict[str, Any], object], None] | None = None

    def hand_over(self, path: Path, checkpoint: dict[str, Any]) -> None:
        """The checkpoint the command read from ``path``: what Lightning's restore of that path gets."""
        self.handed = (Path(path).resolve(), checkpoint)

    @override
    def load_checkpoint(
        self, path: _PATH, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        # Lightning's restore calls this with the path it resolved (test_private_routes pins that route).
        if self.handed is not None and self.handed[0] == Path(path).resolve():
            checkpoint = self.handed[1]
        else:
            checkpoint = read_checkpoint(path, map_location=map_location or "cpu")
        if self.fits is not None:
            self.fits(checkpoint, path)
        return checkpoint

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        target = Path(path)
        state = checkpoint.get("state_dict", {})
        broken = non_finite_weights(state)
        if broken:
            raise NonFiniteWeightsError(target, broken, len(state), int(checkpoint.get("global_step", 0)))
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_partials(target.parent, "*.ckpt")  # only rank 0 writes checkpoints
        # About what the file will take: its tensors, or as much as the run's other checkpoints if more.
        needed = max([tensor_bytes(checkpoint), *(path.stat().st_size for path in target.parent.glob("*.ckpt"))])
        with Partial(target, needed=needed) as partial:
            torch.save(checkpoint, partial)
        self.written[target] = int(checkpoint.get("global_step", 0))


def stored_entry(path: str | os.PathLike, key: str) -> Any | None:
    """One top-level entry of a checkpoint (memory-mapped, so the weights are not read), or None if unreadable.

    For the lines a command ends with, which must not fail because of the file they mention.
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)[key]
    except Exception:
        return None


def damaged_record(container: zipfile.ZipFile) -> str | None:
    """The first record of a checkpoint whose bytes fail the CRC-32 its zip container stored, or None if all pass.

    ``torch.load`` does not check them: a flipped bit in a weight would load without a word.
    """
    bad = container.testzip()
    return bad.split("/", 1)[-1] if bad is not None else None


def read_checkpoint(path: str | os.PathLike, map_location: Any = "cpu") -> dict[str, Any]:
    """A checkpoint's contents (weights-only, on the CPU), read once, or one line on what is wrong with the file.

    The bytes are read once and everything (the checksums, the unpickling) works on that copy, so a file
    replaced meanwhile cannot slip past the checks. Pickled objects are refused, and so is a tensor that
    claims more elements than the file holds (a zero-stride view of absurd size), before anything uses it.
    What a command then takes from the dict is ``checkpoint_values``' business.
    """
    try:
        data = Path(path).read_bytes()
        with zipfile.ZipFile(io.BytesIO(data)) as container:
            bad = damaged_record(container)
        if bad is not None:
            raise CheckpointError(
                f"{path} is corrupt: its record {bad} fails its checksum (bytes changed on disk); use another "
                "checkpoint of the run, e.g. its checkpoints/last.ckpt or best-*.ckpt"
            )
        checkpoint = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        # torch's message suggests weights_only=False, which would run the file's code: never for a file
        # of unknown origin, and this project's checkpoints never need it.
        raise CheckpointError(
            f"{path} holds objects no checkpoint of this project contains (or is corrupt); use a checkpoint "
            "written by main.py fit, and do not load this file with weights_only=False unless you trust its source"
        ) from error
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError, KeyError) as error:
        if isinstance(error, CheckpointError):
            raise
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise CheckpointError(
            f"{path} is not a readable checkpoint (truncated or corrupt: {reason}); use another checkpoint of the "
            "run, e.g. its checkpoints/last.ckpt or best-*.ckpt"
        ) from error
    if not isinstance(checkpoint, dict) or not {"state_dict", "hyper_parameters"} <= checkpoint.keys():
        raise CheckpointError(f"{path} is not a checkpoint written by main.py fit of this project; give one that is")
    check_structure(checkpoint, path)
    return checkpoint
