"""Archives in the official CIFAR byte layout, written from arrays: the tests' data, with no download.

The official batches are Python 2 pickles (protocol 2, py2 ``str`` keys and a numpy array pickled
by numpy 1.x); ``write_archive`` writes the same bytes, so any CIFAR reader (torchvision's, the
original Python 2 scripts, this project's) accepts what it packs. ``classifier_engine.bench data``
uses it too, for a synthetic archive where no real one is given.
"""

from __future__ import annotations

import gzip
import io
import struct
import tarfile
from pathlib import Path

import numpy as np

from ..data.cifar_format import (
    CIFAR10,
    CIFAR100,
    IMAGE_SHAPE,
    ROW_LENGTH,
    CifarFormat,
)


def _py2_pickle(obj: object) -> bytes:
    """Pickle ``obj`` as Python 2's cPickle (protocol 2) would: text as py2 ``str`` opcodes."""
    out = bytearray(b"\x80\x02")  # PROTO 2
    _emit(out, obj)
    out += b"."  # STOP
    return bytes(out)


def _emit_str(out: bytearray, data: bytes) -> None:
    if len(data) < 256:
        out += b"U" + bytes([len(data)]) + data  # SHORT_BINSTRING
    else:
        out += b"T" + struct.pack("<I", len(data)) + data  # BINSTRING


def _emit(out: bytearray, obj: object) -> None:
    if obj is None:
        out += b"N"
    elif isinstance(obj, bool):
        out += b"\x88" if obj else b"\x89"
    elif isinstance(obj, (int, np.integer)):
        value = int(obj)
        if 0 <= value < 256:
            out += b"K" + bytes([value])
        elif 0 <= value < 65536:
            out += b"M" + struct.pack("<H", value)
        else:
            out += b"J" + struct.pack("<i", value)
    elif isinstance(obj, str):
        _emit_str(out, obj.encode("latin1"))
    elif isinstance(obj, bytes):
        _emit_str(out, obj)
    elif isinstance(obj, tuple):
        out += b"("
        for item in obj:
            _emit(out, item)
        out += b"t"
    elif isinstance(obj, list):
        out += b"]"
        if obj:
            out += b"("
            for item in obj:
                _emit(out, item)
            out += b"e"
    elif isinstance(obj, dict):
        out += b"}"
        if obj:
            out += b"("
            for key, value in obj.items():
                _emit(out, key)
                _emit(out, value)
            out += b"u"
    elif isinstance(obj, np.ndarray):
        _emit_uint8_array(out, obj)
    else:
        raise TypeError(f"cannot write {type(obj).__name__} into a CIFAR batch")


def _emit_uint8_array(out: bytearray, array: np.ndarray) -> None:
    """numpy 1.x's reduction of a C-contiguous uint8 array, as found in the official batches."""
    if array.dtype != np.uint8:
        raise TypeError(f"CIFAR image data must be uint8, got {array.dtype}")
    out += b"cnumpy.core.multiarray\n_reconstruct\n"  # GLOBAL
    out += b"cnumpy\nndarray\n"
    _emit(out, (0,))
    _emit(out, "b")
    out += b"\x87R"  # TUPLE3, REDUCE
    out += b"("
    _emit(out, 1)
    _emit(out, tuple(array.shape))
    out += b"cnumpy\ndtype\n"
    _emit(out, "u1")
    out += b"\x89\x88\x87R"  # False, True, TUPLE3, REDUCE
    _emit(out, (3, "|", None, None, None, -1, -1, 0))
    out += b"b"  # BUILD the dtype
    out += b"\x89"  # not Fortran order
    _emit_str(out, np.ascontiguousarray(array).tobytes())
    out += b"tb"  # state tuple, BUILD the array


def _add_file(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def _batch(fmt: CifarFormat, label: str, images: np.ndarray, labels: np.ndarray) -> dict[str, object]:
    rows = np.ascontiguousarray(images, dtype=np.uint8).reshape(len(images), ROW_LENGTH)
    batch: dict[str, object] = {"batch_label": label, fmt.labels_key: [int(y) for y in labels], "data": rows}
    batch["filenames"] = [f"image_{i:06d}.png" for i in range(len(images))]
    if fmt is CIFAR100:
        batch["coarse_labels"] = [0 for _ in labels]
    return batch


def write_archive(
    path: str | Path,
    fmt: CifarFormat,
    train_images: np.ndarray,
    train_labels: np.ndarray,
    test_images: np.ndarray,
    test_labels: np.ndarray,
    class_names: list[str] | tuple[str, ...] | None = None,
) -> Path:
    """Pack uint8 images of shape (N, 3, 32, 32) into ``fmt``'s official archive layout.

    Training images are split over ``fmt.train_files`` as evenly as the official batches. The
    file holds no timestamps, so the same arrays always pack to the same bytes (and the same MD5,
    which is the data's identity in a run's hash).
    """
    path = Path(path)
    names = list(class_names or fmt.class_names)
    for images in (train_images, test_images):
        if images.ndim != 4 or images.shape[1:] != IMAGE_SHAPE:
            raise ValueError(f"images must have shape (N, 3, 32, 32), got {images.shape}")
    path.parent.mkdir(parents=True, exist_ok=True)  # e.g. my_data/, as the README writes it
    with gzip.GzipFile(path, "wb", mtime=0) as packed, tarfile.open(fileobj=packed, mode="w") as tar:
        chunks = np.array_split(np.arange(len(train_images)), len(fmt.train_files))
        for index, (file_name, chunk) in enumerate(zip(fmt.train_files, chunks, strict=True), start=1):
            label = f"training batch {index} of {len(fmt.train_files)}"
            batch = _batch(fmt, label, train_images[chunk], train_labels[chunk])
            _add_file(tar, fmt.member(file_name), _py2_pickle(batch))
        for file_name in fmt.test_files:
            batch = _batch(fmt, "testing batch 1 of 1", test_images, test_labels)
            _add_file(tar, fmt.member(file_name), _py2_pickle(batch))
        meta: dict[str, object] = {fmt.names_key: names}
        if fmt is CIFAR10:
            meta.update(num_cases_per_batch=len(chunks[0]), num_vis=ROW_LENGTH)
        else:
            meta["coarse_label_names"] = ["all"]
        _add_file(tar, fmt.member(fmt.meta_file), _py2_pickle(meta))
        if fmt is CIFAR10:
            _add_file(tar, fmt.member("readme.html"), b"<html><body>Packed in the CIFAR format.</body></html>\n")
    return path
