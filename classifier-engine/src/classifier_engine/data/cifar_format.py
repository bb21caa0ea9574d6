"""The official CIFAR archive layout, and a reader for it.

The official batches are Python 2 pickles (protocol 2, py2 ``str`` keys and a numpy array
pickled by numpy 1.x). ``read_batch`` loads them with a restricted unpickler that accepts
nothing but the numpy classes a batch holds, so a foreign archive cannot run code. (The tests
write archives of the same byte layout: ``classifier_engine.testing.cifar_archives``.)
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from typing_extensions import override

IMAGE_SHAPE = (3, 32, 32)
ROW_LENGTH = 3 * 32 * 32

CIFAR10_CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)

CIFAR100_CLASSES = (
    "apple",
    "aquarium_fish",
    "baby",
    "bear",
    "beaver",
    "bed",
    "bee",
    "beetle",
    "bicycle",
    "bottle",
    "bowl",
    "boy",
    "bridge",
    "bus",
    "butterfly",
    "camel",
    "can",
    "castle",
    "caterpillar",
    "cattle",
    "chair",
    "chimpanzee",
    "clock",
    "cloud",
    "cockroach",
    "couch",
    "crab",
    "crocodile",
    "cup",
    "dinosaur",
    "dolphin",
    "elephant",
    "flatfish",
    "forest",
    "fox",
    "girl",
    "hamster",
    "house",
    "kangaroo",
    "keyboard",
    "lamp",
    "lawn_mower",
    "leopard",
    "lion",
    "lizard",
    "lobster",
    "man",
    "maple_tree",
    "motorcycle",
    "mountain",
    "mouse",
    "mushroom",
    "oak_tree",
    "orange",
    "orchid",
    "otter",
    "palm_tree",
    "pear",
    "pickup_truck",
    "pine_tree",
    "plain",
    "plate",
    "poppy",
    "porcupine",
    "possum",
    "rabbit",
    "raccoon",
    "ray",
    "road",
    "rocket",
    "rose",
    "sea",
    "seal",
    "shark",
    "shrew",
    "skunk",
    "skyscraper",
    "snail",
    "snake",
    "spider",
    "squirrel",
    "streetcar",
    "sunflower",
    "sweet_pepper",
    "table",
    "tank",
    "telephone",
    "television",
    "tiger",
    "tractor",
    "train",
    "trout",
    "tulip",
    "turtle",
    "wardrobe",
    "whale",
    "willow_tree",
    "wolf",
    "woman",
    "worm",
)


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
