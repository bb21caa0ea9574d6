"""Pack labelled images into a litdata dataset in object storage (or a folder), on one machine or many.

``pack.py`` lists the images as ``fit`` would (``image_sources.py``), holds out validation and
test images by the same seeded, stratified split, and hands litdata's ``optimize()`` groups of a
few images each: one item holds ``images_per_item`` images, because litdata's cost per item
dwarfs a small image's (docs/benchmarks.md). Each split becomes a litdata dataset under
``<output>/<split>/``; ``dataset.json``, written last, says what the whole is (classes, sizes,
the manifest's digest), so a reader never takes a half-written dataset for a whole one.

Across machines every node lists the same images and packs the groups litdata deals it
(``DATA_OPTIMIZER_NUM_NODES`` / ``DATA_OPTIMIZER_NODE_RANK``); the last node merges the index files.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DataError, DataSettingError
from ..image_sources import Entry, LabelledImages
from ..packing import PackSettings, decode_task, manifest_digest
from .format import DATASET_FILE, SPLITS, STREAM_FORMAT_VERSION, read_record
from .object_store import (
    configure_store_client,
    is_remote,
    join,
    read_text,
    remove_prefix,
    store_error,
    write_text,
)

ITEM_BYTES = 2**17  # about 128 KiB of pixels per item by default (16 images at 48 px, 3 at 112 px, 1 from 208 px)
CHUNK_BYTES = "64MB"  # litdata's default chunk: large enough for object storage, small enough to cache many
NODE_WAIT_SECONDS = 2.0
# A DataModule's split(labels, fractions) -> rows (train, val, test).
Splitter = Callable[[np.ndarray, tuple[float, float]], tuple[np.ndarray, np.ndarray, np.ndarray]]
FAILED_SUFFIX = ".failed"  # a worker's note of the unreadable image that stops a strict packing


def default_images_per_item(side: int) -> int:
    """About ``ITEM_BYTES`` of pixels, rounded down to a power of two: the usual batch sizes are multiples of it."""
    fitting = max(1, min(64, ITEM_BYTES // (3 * side * side)))
    return 1 << (fitting.bit_length() - 1)


@dataclass(frozen=True)
class Group:
    """The images of one item: each with its id (its place in the split), key and label."""

    ids: tuple[int, ...]
    keys: tuple[str, ...]
    labels: tuple[int, ...]


class ItemMaker:
    """What litdata's workers call on each group: decode its images into one item (uint8, ids, labels, names).

    An image left out is also noted in ``skipped_dir`` (one file per worker process), so that the record
    counts the images stored, not those planned.
    """

    def __init__(self, root: str, settings: PackSettings, strict: bool, skipped_dir: str) -> None:
        self.root = root
        self.rule = (settings.side, settings.resize, settings.interpolation, 1.0)
        self.strict = strict
        self.skipped_dir = skipped_dir

    def __call__(self, group: Group) -> dict[str, Any]:
        configure_store_client()  # a spawned worker imports litdata afresh
        kept: list[int] = []
        pixels: list[np.ndarray] = []
        side = self.rule[0]
        # With on_bad_image error, a worker notes the bad file rather than raising (litdata would print the
        # worker's traceback), and the groups after it are left empty; pack_to_store then refuses in one line.
        failed = self.strict and any(Path(self.skipped_dir).glob(f"*{FAILED_SUFFIX}"))
        for position, key in enumerate(() if failed else group.keys):
            data, reason = decode_task((self.root, key, self.rule))
            if data is None:
                note = f"{os.getpid()}{FAILED_SUFFIX if self.strict else '.txt'}"
                with open(os.path.join(self.skipped_dir, note), "a", encoding="utf-8") as noted:
                    noted.write(f"{key}\t{reason}\n")
                if self.strict:
                    break
                print(f"skipped {key}: {reason}", flush=True)
                continue
            kept.append(position)
            pixels.append(np.frombuffer(data, dtype=np.uint8).reshape(3, side, side))
        images = np.stack(pixels) if pixels else np.zeros((0, 3, side, side), np.uint8)
        return {
            "images": np.ascontiguousarray(images),
            "labels": np.asarray([group.labels[i] for i in kept], dtype=np.int64),
            "ids": np.asarray([group.ids[i] for i in kept], dtype=np.int64),
            "names": "\n".join(group.keys[i] for i in kept),
        }


def planned_splits(
    found: LabelledImages, val_fraction: float, test_fraction: float, split_seed: int, split: Splitter | None = None
) -> dict[str, list[Entry]]:
    """The images of each split: those the source gives, else held out of train as ``fit`` holds them out.

    ``split``: the DataModule's own ``split(labels, fractions)`` (a project's may split by photographer or
    date); by default the seeded, stratified split.
    """
    from ..folder import stratified_split  # the one rule of the held-out split

    split = split or (lambda labels, fractions: stratified_split(labels, fractions, split_seed))
    train = found.splits["train"]
    fractions = (
        0.0 if "val" in found.splits else val_fraction,
        0.0 if "test" in found.splits else test_fraction,
    )
    rows = split(np.asarray([entry.label for entry in train], dtype=np.int64), fractions)
    planned = {name: [train[row] for row in part] for name, part in zip(SPLITS, rows, strict=True)}
    for name in ("val", "test"):
        if name in found.splits:
            planned[name] = list(found.splits[name])
    return {name: entries for name, entries in planned.items() if entries}


def grouped(entries: list[Entry], per_item: int, seed: int) -> list[Group]:
    """The split's images dealt into items of ``per_item``, in a seeded order (each item mixes the classes)."""
    order = np.random.default_rng(seed).permutation(len(entries))
    groups = []
    for start in range(0, len(order), per_item):
        ids = tuple(int(i) for i in order[start : start + per_item])
        groups.append(Group(ids, tuple(entries[i].key for i in ids), tuple(entries[i].label for i in ids)))
    return groups


def _wait_for_node_indexes(split_dir: str, nodes: int) -> None:
    """A folder output's last node waits for the others' index files (litdata waits only in object storage)."""
    waiting = [Path(split_dir, f"{rank}-index.json") for rank in range(nodes - 1)]
    while not all(path.is_file() for path in waiting):
        time.sleep(NODE_WAIT_SECONDS)


def _skipped_here(skipped_dir: str) -> list[str]:
    """The keys this machine's workers left out of one split."""
    notes = (line for path in Path(skipped_dir).glob("*.txt") for line in path.read_text("utf-8").splitlines())
    return sorted(line.split("\t", 1)[0] for line in notes)


def _failure_here(skipped_dir: str) -> tuple[str, str] | None:
    """(key, reason) of the unreadable image that stopped a strict packing on this machine, if one did."""
    notes = sorted(
        line for path in Path(skipped_dir).glob(f"*{FAILED_SUFFIX}") for line in path.read_text("utf-8").splitlines()
    )
    return tuple(notes[0].split("\t", 1)) if notes else None  # type: ignore[return-value]


def _refuse_bad_image(root: Path, key: str, reason: str) -> DataError:
    return DataError(
        f"{root / key} is not a readable image ({reason}); remove or replace it, or set --data.on_bad_image skip "
        "to leave such files out"
    )


def skipped_list(split: str, rank: int) -> str:
    """The file (beside ``dataset.json``, outside the split's litdata folder) listing what process ``rank`` left out."""
    return f"skipped-{split}-{rank}.txt"


def _skipped_everywhere(
    output: str, split: str, mine: list[str], nodes: int, node_rank: int, options: dict[str, Any]
) -> list[str]:
    """Every node's skipped keys of ``split``: each node writes its own list; the last one reads them all."""
    write_text(output, skipped_list(split, node_rank), "".join(f"{key}\n" for key in mine), options)
    if node_rank != nodes - 1:
        return mine
    everything = list(mine)
    for rank in range(nodes - 1):
        while (text := read_text(output, skipped_list(split, rank), options)) is None:
            time.sleep(NODE_WAIT_SECONDS)
        if text.startswith(FAILED_SUFFIX):  # that node stopped at a bad image (on_bad_image error)
            raise DataError(f"process {rank} of the packing stopped: {text.split(' ', 1)[1].strip()}")
        everything += text.splitlines()
    return sorted(everything)


def remove_written(output: str, existed: bool, options: dict[str, Any]) -> None:
    """Remove what a refused packing wrote: a folder ``output`` itself if it was not there before, else its splits."""
    written = [*SPLITS, *(skipped_list(split, 0) for split in SPLITS)]  # (one process: a refusal of several leaves it)
    if is_remote(output):
        for name in written:
            remove_prefix(join(output, name), options)
        return
    for target in [Path(output)] if not existed else [Path(output, name) for name in written]:
        if target.is_dir():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)


def _optimize_split(
    maker: ItemMaker,
    output: str,
    split: str,
    groups: list[Group],
    workers: int,
    storage_options: dict[str, Any],
    nodes: int,
    node_rank: int,
) -> None:
    """One split's items written by litdata under ``<output>/<split>/`` (this node's share of them)."""
    from litdata import optimize

    split_dir = join(output, split)
    if nodes > 1 and node_rank == nodes - 1 and not is_remote(output):
        Path(split_dir).mkdir(parents=True, exist_ok=True)
        _wait_for_node_indexes(split_dir, nodes)
    try:
        optimize(
            fn=maker,
            inputs=groups,
            output_dir=split_dir,
            chunk_bytes=CHUNK_BYTES,
            num_workers=max(1, min(workers, len(groups))),
            reorder_files=False,
            # Not litdata's default: that deletes what is there, other nodes' chunks included; a
            # second packing of the same images is refused above (dataset.json), another one below.
            mode="append",
            storage_options=storage_options,
            verbose=False,
            start_method="fork" if os.name == "posix" else None,
        )
    except (DataError, DataSettingError):
        raise
    except Exception as error:
        cause = error
        while cause.__cause__ is not None:
            cause = cause.__cause__
        if isinstance(cause, DataError):
            raise cause from error
        if is_remote(output):
            raise store_error(cause, output) from error
        raise


def pack_to_store(
    found: LabelledImages,
    settings: PackSettings,
    output: str,
    *,
    val_fraction: float,
    test_fraction: float,
    split_seed: int,
    split: Splitter | None = None,
    images_per_item: int | None,
    workers: int,
    strict: bool,
    storage_options: dict[str, Any],
    nodes: int = 1,
    node_rank: int = 0,
) -> dict[str, Any]:
    """Pack ``found`` at ``output``; returns the dataset record (``dataset.json``) the last node writes."""
    if found.task == "multilabel":
        raise DataSettingError(
            f"{found.root} has several labels per image, which a streamed store does not hold (one label per image); "
            "train on it with ImageFolderDataModule (configs/images.yaml)"
        )
    configure_store_client()
    digest = manifest_digest(found, settings)
    existing = read_record(output, storage_options)
    if existing is not None:
        if existing.get("digest") == digest:
            return existing
        raise DataSettingError(
            f"{output} already holds another packed dataset (of {existing.get('source')} at "
            f"{existing.get('image_size')} px); choose another --output, or delete that one first"
        )
    per_item = images_per_item or default_images_per_item(settings.side)
    planned = planned_splits(found, val_fraction, test_fraction, split_seed, split)
    if "val" not in planned:
        raise DataSettingError(f"{found.root}: no image is left for validation; add images or raise data.val_fraction")
    os.environ["DATA_OPTIMIZER_NUM_NODES"] = str(nodes)
    os.environ["DATA_OPTIMIZER_NODE_RANK"] = str(node_rank)
    stored: dict[str, list[Entry]] = {}
    existed = not is_remote(output) and Path(output).exists()
    with tempfile.TemporaryDirectory(prefix="pack-") as scratch:
        # litdata stages chunks in one folder per machine by default; packers sharing a machine would collide.
        os.environ["DATA_OPTIMIZER_CACHE_FOLDER"] = os.path.join(scratch, "chunks")
        os.environ["DATA_OPTIMIZER_DATA_CACHE_FOLDER"] = os.path.join(scratch, "data")
        for split, entries in planned.items():
            skipped_dir = os.path.join(scratch, f"skipped-{split}")
            os.makedirs(skipped_dir)
            maker = ItemMaker(str(found.root), settings, strict, skipped_dir)
            groups = grouped(entries, per_item, split_seed)
            _optimize_split(maker, output, split, groups, workers, storage_options, nodes, node_rank)
            failure = _failure_here(skipped_dir)
            if failure is not None:
                error = _refuse_bad_image(found.root, *failure)
                if nodes > 1:  # the last process must not wait for this one's list
                    write_text(output, skipped_list(split, node_rank), f"{FAILED_SUFFIX} {error}", storage_options)
                else:
                    remove_written(output, existed, storage_options)
                raise error
            left_out = set(
                _skipped_everywhere(output, split, _skipped_here(skipped_dir), nodes, node_rank, storage_options)
            )
            stored[split] = [entry for entry in entries if entry.key not in left_out]
    if not stored.get("train") or not stored.get("val"):
        split = "val" if stored.get("train") else "train"
        raise DataSettingError(
            f"{found.root.name}: every {split} image was unreadable, so nothing is left to "
            f"{'validate' if split == 'val' else 'train'} on; replace the broken files, then pack to another --output"
        )
    record = {
        "format_version": STREAM_FORMAT_VERSION,
        "digest": digest,
        "source": found.root.name,  # the folder's name: a store may be shared, the machine's paths are not
        "image_size": settings.image_size,
        "side": settings.side,
        "resize": settings.resize,
        "interpolation": settings.interpolation,
        "crop_pct": settings.crop_pct,
        "class_names": found.class_names,
        "images_per_item": per_item,
        "counts": {split: len(entries) for split, entries in stored.items()},  # what was stored, skipped files not
        "class_counts": {
            split: np.bincount([entry.label for entry in entries], minlength=len(found.class_names)).tolist()
            for split, entries in stored.items()
        },
        "split_seed": split_seed,
    }
    if node_rank == nodes - 1:  # after its merges: the record's presence means the whole dataset is there
        write_text(output, DATASET_FILE, json.dumps(record, indent=1), storage_options)
    return record
