"""Pack labelled images once into the memory-mapped uint8 arrays the fast path reads, and find them again.

A packed copy is named by its manifest: every image's relative path, class, size and
modification time, and the packing settings (size, resize rule). The same folder and settings
find the same copy and decode nothing; an added, removed or changed image, or another size,
makes another copy (and another run identity: the manifest's digest is the data's fingerprint).

Packing decodes in parallel processes into a converted copy (``foundation/converted_copy.py``):
a killed packing leaves nothing a later run could take for complete, and two processes packing the
same images (DDP ranks on several nodes, two jobs) wait for each other instead of writing together.
The source is only read.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from lightning.pytorch.utilities import rank_zero_info
from tqdm import tqdm

from ..foundation.converted_copy import ConvertedCopy, SplitArrays
from ..foundation.files import NoSpaceError, writable
from .errors import DataError, DataSettingError
from .image_files import BadImageError, Interpolation, Resize, decode_image, packed_side, resize_array
from .image_sources import LabelledImages, read_array_images

PACK_FORMAT_VERSION = 1
BAD_IMAGES = "bad_images.txt"
IMBALANCE_RATIO = 10  # most / fewest training images per class above which the summary warns


@dataclass(frozen=True)
class PackSettings:
    """How images become arrays: what the packed copy's pixels depend on."""

    image_size: int
    resize: Resize
    interpolation: Interpolation = "bilinear"
    crop_pct: float = 1.0

    @property
    def side(self) -> int:
        """The packed images' side: ``image_size`` plus the evaluation crop's margin (``packed_side``)."""
        return packed_side(self.image_size, self.resize, self.crop_pct)

    def recorded(self) -> dict[str, Any]:
        """What names the copy: the settings, the ones at their defaults left out (copies of earlier releases)."""
        defaults = {"interpolation": "bilinear", "crop_pct": 1.0}
        recorded = {key: value for key, value in vars(self).items() if defaults.get(key, object()) != value}
        return recorded | ({"side": self.side} if self.side != self.image_size else {})


@dataclass(frozen=True)
class PackedImages:
    """A complete packed copy: a folder of ``<split>_images.npy`` (N, 3, S, S) uint8 and ``<split>_labels.npy``."""

    root: Path
    meta: dict[str, Any]

    @property
    def splits(self) -> list[str]:
        return list(self.meta["counts"])

    @property
    def class_names(self) -> list[str]:
        return list(self.meta["class_names"])

    def split(self, name: str) -> SplitArrays:
        return SplitArrays.in_folder(self.root, name)

    def keys(self, name: str) -> list[str]:
        """What each packed row was: its file relative to the source (or its array row)."""
        return (self.root / f"{name}_files.txt").read_text(encoding="utf-8").splitlines()


def manifest_digest(found: LabelledImages, settings: PackSettings) -> str:
    """The hex SHA-256 of what the packed pixels depend on (no pixel is read)."""
    digest = hashlib.sha256()
    header = {"version": PACK_FORMAT_VERSION, "settings": settings.recorded(), "classes": found.class_names}
    digest.update(json.dumps(header, sort_keys=True).encode())
    for split in sorted(found.splits):
        for entry in found.splits[split]:
            digest.update(f"{split}\t{entry.key}\t{entry.label}\t{entry.size}\t{entry.mtime_ns}\n".encode())
    for path in found.array_files:
        stat = path.stat()
        digest.update(f"{path.name}\t{stat.st_size}\t{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def packed_folder(cache_dir: Path, found: LabelledImages, settings: PackSettings) -> Path:
    """``<cache_dir>/<source name>-<S>px-<digest>``: readable, and unique to the manifest."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", (found.root.name or "images")).strip("-.") or "images"
    return Path(cache_dir) / f"{name}-{settings.image_size}px-{manifest_digest(found, settings)[:12]}"


def open_packed(folder: Path) -> PackedImages | None:
    """The packed copy in ``folder`` if it is complete and whole (its files have the sizes and checksums recorded)."""
    copy = ConvertedCopy(Path(folder))
    meta = copy.marker()
    if meta is None or meta.get("format_version") != PACK_FORMAT_VERSION:
        return None
    damaged = copy.damage(meta)
    if damaged is not None:
        rank_zero_info(f"Data: the packed copy {folder} is damaged ({damaged}); it is not used (packing makes it anew)")
        return None
    return PackedImages(copy.folder, meta)


# Decoding runs in worker processes: each gets (root, key) tasks and returns the pixels or the reason.
_arrays: dict[Path, np.ndarray] = {}


# A task: the source folder, the image's key, and the rule (size, resize, interpolation, crop share).
Task = tuple[str, str, tuple[int, str, str, float]]


def decode_task(task: Task) -> tuple[bytes | None, str]:
    """The image a task names, as (C, H, W) uint8 bytes, or (None, why it is not a readable image)."""
    root, key, rule = task
    if ":" in key and key.split(":", 1)[0].endswith(".npy"):  # a row of an array file
        name, row = key.rsplit(":", 1)
        path = Path(root, name)
        if path not in _arrays:
            _arrays[path] = read_array_images(path)
        pixels = resize_array(np.ascontiguousarray(_arrays[path][int(row)]), *rule)  # type: ignore[arg-type]
        return pixels.transpose(2, 0, 1).tobytes(), ""
    try:
        pixels = decode_image(Path(root, key), *rule)  # type: ignore[arg-type]
    except BadImageError as error:
        return None, str(error)
    return pixels.transpose(2, 0, 1).tobytes(), ""


def _decoded(tasks: list[Task], workers: int) -> Iterator[tuple[bytes | None, str]]:
    if workers <= 1 or len(tasks) < 64:
        yield from map(decode_task, tasks)
        return
    # fork: the workers need only PIL and numpy, and start at once (spawn would import the project anew).
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with context.Pool(workers) as pool:
        yield from pool.imap(decode_task, tasks, chunksize=16)


def default_workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def packed_read_only(cache_dir: Path, found: LabelledImages, settings: PackSettings) -> PackedImages:
    """The whole packed copy in a ``cache_dir`` this process cannot write; else a one-line refusal."""
    packed = open_packed(packed_folder(cache_dir, found, settings))
    if packed is None:
        raise DataSettingError(
            f"data.cache_dir {cache_dir} cannot be written (read-only or no permission) and holds no whole packed copy "
            f"of {found.root} at {settings.image_size} px; point data.cache_dir at a folder you can write"
        )
    return packed


def _check_space(folder: Path, needed: int) -> None:
    free = shutil.disk_usage(folder).free
    if free < needed * 1.02 + 2**20:
        raise DataError(
            f"packing the images needs {needed / 2**20:.0f} MB in {folder}, which has {free / 2**20:.0f} MB free; "
            "free space there, point data.cache_dir at a larger disk, or lower data.image_size"
        )


def label_array(labels: list, found: LabelledImages) -> np.ndarray:
    """Class indices (N,) int64, or for multi-label data a (N, classes) uint8 array of 0/1."""
    if found.task != "multilabel":
        return np.asarray(labels, dtype=np.int64)
    array = np.zeros((len(labels), len(found.class_names)), dtype=np.uint8)
    for row, present in enumerate(labels):
        array[row, list(present)] = 1
    return array


def per_class_counts(labels: np.ndarray, classes: int) -> list[int]:
    """Images of each class (multi-label: images each class is present in)."""
    counts = labels.sum(axis=0) if labels.ndim == 2 else np.bincount(labels, minlength=classes)
    return [int(count) for count in counts]


def _write_split(
    partial: Path, split: str, found: LabelledImages, settings: PackSettings, workers: int, strict: bool, bar: tqdm
) -> tuple[int, list[str], list[str]]:
    """Decode one split into ``partial``; returns (images kept, their keys, 'key<TAB>reason' of each bad one)."""
    entries = found.splits[split]
    size = settings.side  # evaluation crops its centre image_size, training a random-resized box from all of it
    shape = (len(entries), 3, size, size)
    images = np.lib.format.open_memmap(partial / f"{split}_images.npy", mode="w+", dtype=np.uint8, shape=shape)
    labels, keys, bad = [], [], []
    rule = (size, settings.resize, settings.interpolation, 1.0)
    tasks = [(str(found.root), entry.key, rule) for entry in entries]
    for entry, (pixels, reason) in zip(entries, _decoded(tasks, workers), strict=True):
        bar.update(1)
        if pixels is None:
            if strict:
                raise DataError(
                    f"{found.root / entry.key} is not a readable image ({reason}); remove or replace it, or set "
                    "data.on_bad_image: skip to leave such files out"
                )
            bad.append(f"{entry.key}\t{reason}")
            continue
        images[len(keys)] = np.frombuffer(pixels, dtype=np.uint8).reshape(3, size, size)
        labels.append(entry.label)
        keys.append(entry.key)
    images.flush()
    if len(keys) < len(entries):  # bad files left out: keep only the rows written
        kept = np.lib.format.open_memmap(
            partial / f".{split}.npy", mode="w+", dtype=np.uint8, shape=(len(keys), *shape[1:])
        )
        kept[:] = images[: len(keys)]
        kept.flush()
        del images, kept
        os.replace(partial / f".{split}.npy", partial / f"{split}_images.npy")
    np.save(partial / f"{split}_labels.npy", label_array(labels, found))
    (partial / f"{split}_files.txt").write_text("".join(f"{key}\n" for key in keys), encoding="utf-8")
    return len(keys), keys, bad


def _pack_into(partial: Path, found: LabelledImages, settings: PackSettings, workers: int, strict: bool) -> dict:
    counts, class_counts, bad = {}, {}, []
    with tqdm(total=found.count(), desc="Packing images", unit="img", disable=None, leave=False) as bar:
        for split in sorted(found.splits, key=("train", "val", "test").index):
            count, _, bad_here = _write_split(partial, split, found, settings, workers, strict, bar)
            counts[split] = count
            class_counts[split] = per_class_counts(np.load(partial / f"{split}_labels.npy"), len(found.class_names))
            bad += bad_here
    if bad:
        (partial / BAD_IMAGES).write_text("".join(f"{line}\n" for line in bad), encoding="utf-8")
    return {
        "format_version": PACK_FORMAT_VERSION,
        "source": str(found.root),
        "layout": found.layout,
        **settings.recorded(),
        "class_names": found.class_names,
        "task": found.task,
        "counts": counts,
        "class_counts": class_counts,
        "bad_images": len(bad),
    }


def pack(
    found: LabelledImages,
    settings: PackSettings,
    cache_dir: Path,
    *,
    workers: int | None = None,
    on_bad_image: str = "skip",
) -> PackedImages:
    """The packed copy of ``found`` at ``settings``: reused when complete, else packed now (atomically)."""
    folder = packed_folder(cache_dir, found, settings)
    if not writable(folder.parent):  # a shared, read-only copy: read it, take no lock
        return packed_read_only(cache_dir, found, settings)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DataSettingError(
            f"data.cache_dir={cache_dir} cannot be written ({error.strerror}); point data.cache_dir at a folder "
            "you can write"
        ) from error
    copy = ConvertedCopy(folder)
    with copy.making():  # the other process's packing, if any, completes first
        packed = open_packed(folder)
        if packed is not None:
            rank_zero_info(
                f"Data: {sum(packed.meta['counts'].values())} images already packed in {folder} "
                f"({settings.image_size} px, {settings.resize}); nothing to decode"
            )
            return packed
        needed = found.count() * 3 * settings.side**2
        _check_space(folder.parent, needed)
        workers = workers or default_workers()
        start = time.perf_counter()
        try:
            # A full disk on the way out is NoSpaceError.
            meta = copy.build(
                lambda partial: _pack_into(partial, found, settings, workers, on_bad_image == "error"), needed
            )
        except NoSpaceError as error:  # the same, saying where else the copy may go
            raise NoSpaceError(folder, needed, error.free, "point data.cache_dir elsewhere") from error
        seconds = time.perf_counter() - start
    packed = PackedImages(folder, meta)
    kept = sum(meta["counts"].values())
    megabytes = sum(record["bytes"] for record in meta["files"].values()) / 2**20
    rank_zero_info(
        f"Data: packed {kept} images from {found.root} in {seconds:.1f} s ({kept / max(seconds, 1e-9):.0f} images/s, "
        f"{workers} processes) into {folder} ({megabytes:.1f} MB)"
    )
    if meta["bad_images"]:
        rank_zero_info(
            f"Warning: left out {meta['bad_images']} unreadable images; {folder / BAD_IMAGES} lists each and why"
        )
    return packed


def class_table(packed: PackedImages) -> str:
    """Images per class and split, as a few aligned lines (20 classes at most; then a summary line)."""
    names, counts = packed.class_names, packed.meta["class_counts"]
    splits = [split for split in ("train", "val", "test") if split in counts]
    if len(names) > 20:
        train = counts["train"]
        return (
            f"{len(names)} classes; training images per class: fewest {min(train)}, median "
            f"{int(np.median(train))}, most {max(train)}"
        )
    width = max(len(name) for name in names)
    lines = [f"{'class':<{width}}  " + "  ".join(f"{split:>7}" for split in splits)]
    for index, name in enumerate(names):
        lines.append(f"{name:<{width}}  " + "  ".join(f"{counts[split][index]:>7}" for split in splits))
    return "\n".join(lines)


def imbalance(class_counts: list[int]) -> float:
    """Most over fewest images per class (inf when a class has none)."""
    fewest = min(class_counts)
    return float("inf") if fewest == 0 else max(class_counts) / fewest
