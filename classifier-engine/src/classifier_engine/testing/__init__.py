"""Tiny data in the formats users have, written by tests: CIFAR archives byte for byte, folders of photos.

A project's tests (and this library's) train on these, so the real loading code runs without a download.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..data.cifar_format import FORMATS, CifarFormat
from .cifar_archives import write_archive

NUM_TRAIN, NUM_TEST = 192, 64


def make_images(count: int, num_classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random 32 px images whose mean colour depends on the label, so a tiny model can learn something."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_classes, count)
    base = (labels[:, None, None, None] * 255 // max(num_classes - 1, 1)).astype(np.int64)
    noise = rng.integers(-40, 41, (count, 3, 32, 32))
    return np.clip(base + noise, 0, 255).astype(np.uint8), labels


def write_tiny_archive(data_dir: Path, fmt: CifarFormat | str = FORMATS["cifar10"], seed: int = 0) -> Path:
    """A CIFAR archive of ``NUM_TRAIN`` training and ``NUM_TEST`` test images in ``data_dir``, as downloaded.

    ``fmt``: the dataset's format, or its name (``"cifar10"``, ``"cifar100"``).
    """
    fmt = FORMATS[fmt] if isinstance(fmt, str) else fmt
    data_dir.mkdir(parents=True, exist_ok=True)
    train = make_images(NUM_TRAIN, len(fmt.class_names), seed)
    test = make_images(NUM_TEST, len(fmt.class_names), seed + 1)
    return write_archive(data_dir / fmt.archive_name, fmt, *train, *test)


def write_image_folder(
    folder: Path, classes: tuple[str, ...] = ("cat", "dog", "fish cake"), per_class: int = 24
) -> Path:
    """Class folders of small photo-like files of mixed sizes, formats and modes, with fixed modification times.

    Each class has its own colour, so a tiny network learns them; the fixed times make the same images
    written in two folders the same data (the manifest records sizes and times).
    """
    from PIL import Image

    rng = np.random.default_rng(0)
    for label, name in enumerate(classes):
        (folder / name).mkdir(parents=True, exist_ok=True)
        for index in range(per_class):
            width, height = (int(side) for side in rng.integers(24, 120, 2))
            pixels = rng.integers(0, 60, (height, width, 3)) + np.eye(3, dtype=np.int64)[label % 3] * 180
            image = Image.fromarray(pixels.astype(np.uint8))
            kind = index % 4
            path = folder / name / f"{index:03d}.{('jpg', 'png', 'PNG', 'webp')[kind]}"
            (image if kind != 2 else image.convert("RGBA")).save(path, **({"quality": 95} if kind == 0 else {}))
            os.utime(path, ns=(1_700_000_000_000_000_000 + index, 1_700_000_000_000_000_000 + index))
    return folder


# Colours of the patches ``write_multilabel_images`` paints, one per label (a tiny network tells them apart).
PATCH_COLOURS = ((230, 30, 30), (30, 200, 40), (40, 60, 230), (240, 220, 30))


def write_multilabel_images(
    folder: Path,
    count: int = 160,
    classes: tuple[str, ...] = ("red", "green", "blue", "yellow"),
    seed: int = 0,
    one_hot: bool = False,
) -> Path:
    """Photos with a patch of each of their labels' colours, listed in ``folder/labels.csv``; returns the CSV.

    Each image has one to three labels (some none at all), drawn at random; the CSV is ``path,labels``
    with the labels separated by spaces (Kaggle Planet's ``tags``), or with ``one_hot`` a header
    ``path,<class>,...`` over 0/1 cells.
    """
    from PIL import Image

    rng = np.random.default_rng(seed)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    for index in range(count):
        present = [k for k in range(len(classes)) if rng.random() < 0.4]
        pixels = np.full((48, 48, 3), 128, dtype=np.int64) + rng.integers(-20, 21, (48, 48, 3))
        for k in present:
            top, left = (int(side) for side in rng.integers(0, 30, 2))
            pixels[top : top + 18, left : left + 18] = PATCH_COLOURS[k % len(PATCH_COLOURS)]
        path = folder / "images" / f"{index:04d}.png"
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(path)
        os.utime(path, ns=(1_700_000_000_000_000_000 + index, 1_700_000_000_000_000_000 + index))
        rows.append((f"images/{path.name}", present))
    csv_path = folder / "labels.csv"
    if one_hot:
        lines = ["path," + ",".join(classes)]
        lines += [
            f"{name}," + ",".join("1" if k in present else "0" for k in range(len(classes))) for name, present in rows
        ]
    else:
        lines = ["path,labels"] + [f"{name},{' '.join(classes[k] for k in present)}" for name, present in rows]
    csv_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return csv_path
