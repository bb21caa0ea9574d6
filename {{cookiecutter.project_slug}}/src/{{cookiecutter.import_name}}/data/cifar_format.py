"""The official CIFAR archive layout, and a reader and writer for it.

The official batches are Python 2 pickles (protocol 2, py2 ``str`` keys and a numpy array
pickled by numpy 1.x). ``read_batch`` loads them with a restricted unpickler that accepts
nothing but the numpy classes a batch holds, so a foreign archive cannot run code.
``write_archive`` writes the same bytes layout, so any CIFAR reader (torchvision's, the
original Python 2 scripts, this project's) accepts what it packs: that is how you bring
your own images, and how the tests build tiny archives without a download.
"""

from __future__ import annotations

import gzip
import io
import pickle
import struct
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
from typing_extensions import override

IMAGE_SHAPE = (3, 32, 32)
ROW_LENGTH = 3 * 32 * 32

CIFAR10_CLASSES = (
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
)  # fmt: skip

CIFAR100_CLASSES = (
    "apple", "aquarium_fish", "baby", "bear", "beaver", "bed", "bee", "beetle", "bicycle", "bottle",
    "bowl", "boy", "bridge", "bus", "butterfly", "camel", "can", "castle", "caterpillar", "cattle",
    "chair", "chimpanzee", "clock", "cloud", "cockroach", "couch", "crab", "crocodile", "cup", "dinosaur",
    "dolphin", "elephant", "flatfish", "forest", "fox", "girl", "hamster", "house", "kangaroo", "keyboard",
    "lamp", "lawn_mower", "leopard", "lion", "lizard", "lobster", "man", "maple_tree", "motorcycle", "mountain",
    "mouse", "mushroom", "oak_tree", "orange", "orchid", "otter", "palm_tree", "pear", "pickup_truck", "pine_tree",
    "plain", "plate", "poppy", "porcupine", "possum", "rabbit", "raccoon", "ray", "road", "rocket",
    "rose", "sea", "seal", "shark", "shrew", "skunk", "skyscraper", "snail", "snake", "spider",
    "squirrel", "streetcar", "sunflower", "sweet_pepper", "table", "tank", "telephone", "television", "tiger",
    "tractor", "train", "trout", "tulip", "turtle", "wardrobe", "whale", "willow_tree", "wolf", "woman", "worm",
)  # fmt: skip


@dataclass(frozen=True)
class CifarFormat:
    """Where things are inside one official archive, and its published facts."""

    name: str
    title: str
    url: str
    archive_name: str
    md5: str
    folder: str
    train_files: tuple[str, ...]
    test_files: tuple[str, ...]
    meta_file: str
    labels_key: str
    names_key: str
    class_names: tuple[str, ...]
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    def member(self, file_name: str) -> str:
        return f"{self.folder}/{file_name}"


CIFAR10 = CifarFormat(
    name="cifar10",
    title="CIFAR-10",
    url="https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
    archive_name="cifar-10-python.tar.gz",
    md5="c58f30108f718f92721af3b95e74349a",
    folder="cifar-10-batches-py",
    train_files=tuple(f"data_batch_{i}" for i in range(1, 6)),
    test_files=("test_batch",),
    meta_file="batches.meta",
    labels_key="labels",
    names_key="label_names",
    class_names=CIFAR10_CLASSES,
    mean=(0.4914, 0.4822, 0.4465),
    std=(0.2470, 0.2435, 0.2616),
)

CIFAR100 = CifarFormat(
    name="cifar100",
    title="CIFAR-100",
    url="https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
    archive_name="cifar-100-python.tar.gz",
    md5="eb9058c3a382ffc7106e4002c42a8d85",
    folder="cifar-100-python",
    train_files=("train",),
    test_files=("test",),
    meta_file="meta",
    labels_key="fine_labels",
    names_key="fine_label_names",
    class_names=CIFAR100_CLASSES,
    mean=(0.5071, 0.4865, 0.4409),
    std=(0.2673, 0.2564, 0.2762),
)

FORMATS = {fmt.name: fmt for fmt in (CIFAR10, CIFAR100)}


class _BatchUnpickler(pickle.Unpickler):
    """Resolve only the numpy globals that a pickled uint8 array needs."""

    _RECONSTRUCT = np.zeros(1).__reduce__()[0]  # numpy.core (1.x) / numpy._core (2.x) _reconstruct
    _ALLOWED: ClassVar[dict[tuple[str, str], object]] = {
        ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,
        ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
    }

    @override
    def find_class(self, module: str, name: str):
        try:
            return self._ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"refusing to load {module}.{name}: a CIFAR batch holds only numpy arrays, lists and strings"
            ) from None


def read_batch(raw: bytes) -> dict[str, object]:
    """Load one batch or meta pickle, whether written by Python 2 or 3, with ``str`` keys."""
    batch = _BatchUnpickler(io.BytesIO(raw), encoding="latin1").load()
    if not isinstance(batch, dict):
        raise pickle.UnpicklingError(f"expected a dict, found {type(batch).__name__}")
    return {key.decode("latin1") if isinstance(key, bytes) else key: value for key, value in batch.items()}


# --- writing, byte-compatible with the official Python 2 pickles --------------------------------


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
