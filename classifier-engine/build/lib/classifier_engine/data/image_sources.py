"""Where your labelled images are: class folders, split folders, a CSV list, or arrays.

``find_images(path)`` reads the layout without decoding anything (a walk of the folder and a
``stat`` of each file) and returns every image with its class and the split it was given in:

- ``path/<class>/**``: one split, ``train``; validation (and test) images are held out later by a
  seeded, stratified split (``ImageFolderDataModule``'s ``val_fraction``, ``test_fraction``).
- ``path/{train,val,test}/<class>/**``: the splits as given (``val``/``valid``/``validation`` and
  ``test`` optional; a class absent from ``val`` or ``test`` is fine, one only outside ``train`` is not).
- ``path`` is a ``.csv`` file of ``path,label`` rows (an optional third column ``split``; paths
  relative to the CSV; a header row is recognized by its ``path`` column).
- ``path`` holds ``images.npy`` and ``labels.npy`` (or ``train_images.npy``, ``val_images.npy``, ...):
  uint8 images (N, H, W, 3) or (N, 3, H, W) and integer labels 0..K-1; class names from
  ``classes.txt`` (one per line) when present.

Class names are sorted (folder names and CSV labels as text; all-integer CSV labels as numbers);
spaces and any script are kept as they are. Hidden files, non-image files and hidden folders are
skipped; symbolic links are followed.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import DataSettingError
from .image_files import IMAGE_SUFFIXES, is_image_file

SPLIT_FOLDERS = {"train": "train", "val": "val", "valid": "val", "validation": "val", "test": "test"}
SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class Entry:
    """One image: its file (relative to the source's root) or its row in an array file, and its class."""

    key: str  # "cats/001.jpg", or "train_images.npy:17"
    label: int
    size: int = 0  # bytes of the file; with mtime, what the manifest records (0 for array rows)
    mtime_ns: int = 0


@dataclass
class LabelledImages:
    """What ``find_images`` found: the images of each split given, and the class names."""

    root: Path
    layout: str  # "class folders", "split folders", "csv", "arrays"
    class_names: list[str]
    splits: dict[str, list[Entry]]
    array_files: list[Path] = field(default_factory=list)  # for "arrays": the files behind the rows

    def count(self) -> int:
        return sum(len(entries) for entries in self.splits.values())

    def class_counts(self, split: str = "train") -> list[int]:
        counts = np.bincount([entry.label for entry in self.splits.get(split, [])], minlength=len(self.class_names))
        return [int(count) for count in counts]


def _refuse(path: Path, problem: str, fix: str) -> DataSettingError:
    return DataSettingError(f"data.image_dir={path} {problem}; {fix}")


def _walk_images(folder: Path) -> Iterator[Path]:
    for directory, subfolders, files in os.walk(folder, followlinks=True):
        subfolders[:] = sorted(name for name in subfolders if not name.startswith("."))
        for name in sorted(files):
            path = Path(directory, name)
            if is_image_file(path):
                yield path


def _entry(root: Path, path: Path, label: int) -> Entry:
    stat = path.stat()  # follows symbolic links: what is read is what is recorded
    return Entry(path.relative_to(root).as_posix(), label, stat.st_size, stat.st_mtime_ns)


def _class_folders(folder: Path) -> list[str]:
    return sorted(entry.name for entry in os.scandir(folder) if entry.is_dir() and not entry.name.startswith("."))


def _from_class_folders(root: Path, folder: Path, class_names: list[str], split: str) -> list[Entry]:
    entries = []
    for label, name in enumerate(class_names):
        if not (folder / name).is_dir():
            continue
        found = [_entry(root, path, label) for path in _walk_images(folder / name)]
        if not found and split == "train":
            raise _refuse(
                root,
                f"has an empty class folder {(folder / name).relative_to(root)} (no {', '.join(IMAGE_SUFFIXES)} "
                "file in it)",
                "put images in it or remove it",
            )
        entries.extend(found)
    return entries


def _check_classes(root: Path, class_names: list[str]) -> None:
    if len(class_names) < 2:
        found = f"only the class {class_names[0]!r}" if class_names else "no class folder"
        raise _refuse(
            root,
            f"has {found}",
            "a classifier needs at least two classes: one folder of images per class (image_dir/<class>/*.jpg)",
        )


def _from_folders(root: Path) -> LabelledImages:
    top = _class_folders(root)
    given = {name: SPLIT_FOLDERS[name.lower()] for name in top if name.lower() in SPLIT_FOLDERS}
    if "train" in given.values() and len(given) == len(top):
        by_split = {split: root / name for name, split in given.items()}
        class_names = _class_folders(by_split["train"])
        _check_classes(root, class_names)
        for folder in by_split.values():
            extra = sorted(set(_class_folders(folder)) - set(class_names))
            if extra:
                raise _refuse(
                    root,
                    f"has classes in {folder.name}/ that train/ lacks ({', '.join(extra[:5])})",
                    "every class needs training images: add them to train/ or remove the folders",
                )
        splits = {split: _from_class_folders(root, folder, class_names, split) for split, folder in by_split.items()}
        return LabelledImages(root, "split folders", class_names, splits)
    loose = sum(1 for path in root.iterdir() if path.is_file() and is_image_file(path))
    if loose and not top:
        raise _refuse(
            root,
            f"holds {loose} images but no class folders",
            "put each class's images in a folder named after the class (image_dir/<class>/*.jpg)",
        )
    _check_classes(root, top)
    return LabelledImages(root, "class folders", top, {"train": _from_class_folders(root, root, top, "train")})


def _sorted_labels(labels: set[str]) -> list[str]:
    try:
        return sorted(labels, key=int)
    except ValueError:
        return sorted(labels)


def _from_csv(csv_path: Path) -> LabelledImages:
    root = csv_path.parent
    with open(csv_path, newline="", encoding="utf-8-sig") as handle:
        rows = [row for row in csv.reader(handle) if row and any(cell.strip() for cell in row)]
    if rows and rows[0][0].strip().lower() == "path":
        rows = rows[1:]
    if not rows:
        raise _refuse(csv_path, "lists no images", "write one 'path,label' row per image")
    bad = next((number for number, row in enumerate(rows, 1) if len(row) < 2 or not row[1].strip()), None)
    if bad is not None:
        raise _refuse(csv_path, f"row {bad} has no label", "write 'path,label' (and optionally ',split') per row")
    class_names = _sorted_labels({row[1].strip() for row in rows})
    _check_classes(csv_path, class_names)
    labels = {name: index for index, name in enumerate(class_names)}
    splits: dict[str, list[Entry]] = {}
    for number, row in enumerate(rows, 1):
        path = (root / row[0].strip()).resolve() if not Path(row[0].strip()).is_absolute() else Path(row[0].strip())
        if not path.is_file():
            raise _refuse(csv_path, f"row {number} names {row[0].strip()}, which does not exist", "fix the path")
        split = SPLIT_FOLDERS.get(row[2].strip().lower(), "") if len(row) > 2 and row[2].strip() else "train"
        if not split:
            raise _refuse(csv_path, f"row {number} has the split {row[2].strip()!r}", "use train, val or test")
        stat = path.stat()
        key = os.path.relpath(path, root)
        splits.setdefault(split, []).append(
            Entry(Path(key).as_posix(), labels[row[1].strip()], stat.st_size, stat.st_mtime_ns)
        )
    if "train" not in splits:
        raise _refuse(csv_path, "has no training rows", "leave the split column empty or 'train' for training images")
    return LabelledImages(root, "csv", class_names, splits)


def array_pair(folder: Path, split: str) -> tuple[Path, Path] | None:
    """The (images, labels) files of ``split`` in an arrays folder (``images.npy`` counts as train)."""
    for prefix in (f"{split}_",) if split != "train" else ("train_", ""):
        images, labels = folder / f"{prefix}images.npy", folder / f"{prefix}labels.npy"
        if images.is_file():
            if not labels.is_file():
                raise _refuse(folder, f"has {images.name} but no {labels.name}", f"save the labels as {labels.name}")
            return images, labels
    return None


def read_array_images(path: Path) -> np.ndarray:
    """An images array as uint8 (N, H, W, 3), memory-mapped when it is already in that layout."""
    images = np.load(path, mmap_mode="r")
    if images.dtype != np.uint8 or images.ndim != 4 or 3 not in (images.shape[1], images.shape[3]):
        raise _refuse(
            path.parent,
            f"{path.name} holds {images.dtype}{tuple(images.shape)}",
            "save uint8 images of shape (N, H, W, 3) or (N, 3, H, W)",
        )
    return images if images.shape[3] == 3 else images.transpose(0, 2, 3, 1)


def _from_arrays(folder: Path) -> LabelledImages:
    splits: dict[str, list[Entry]] = {}
    files: list[Path] = []
    highest = -1
    for split in SPLITS:
        pair = array_pair(folder, split)
        if pair is None:
            continue
        images_path, labels_path = pair
        images, labels = read_array_images(images_path), np.load(labels_path)
        if labels.ndim != 1 or len(labels) != len(images) or not np.issubdtype(labels.dtype, np.integer):
            raise _refuse(
                folder,
                f"{labels_path.name} holds {labels.dtype}{labels.shape} for {len(images)} images",
                "save one integer label per image",
            )
        if len(labels) and labels.min() < 0:
            raise _refuse(folder, f"{labels_path.name} has negative labels", "number the classes from 0")
        highest = max(highest, int(labels.max(initial=-1)))
        splits[split] = [Entry(f"{images_path.name}:{row}", int(label)) for row, label in enumerate(labels)]
        files += [images_path, labels_path]
    if "train" not in splits:
        raise _refuse(folder, "has no images.npy (or train_images.npy)", "save the training images under that name")
    names_file = folder / "classes.txt"
    if names_file.is_file():
        class_names = [line.strip() for line in names_file.read_text(encoding="utf-8").splitlines() if line.strip()]
        if len(class_names) <= highest:
            raise _refuse(
                folder, f"classes.txt names {len(class_names)} classes, labels go up to {highest}", "name every class"
            )
        files.append(names_file)
    else:
        class_names = [str(index) for index in range(highest + 1)]
    _check_classes(folder, class_names)
    return LabelledImages(folder, "arrays", class_names, splits, files)


def find_images(path: Path) -> LabelledImages:
    """Every labelled image under ``path`` (see the module's docstring); one ``DataSettingError`` line if none."""
    path = Path(path).expanduser()
    if path.is_file() and path.suffix.lower() == ".csv":
        found = _from_csv(path)
    elif not path.exists():
        raise _refuse(
            path, "does not exist", "point it at a folder of class folders, a .csv list or a folder of .npy arrays"
        )
    elif not path.is_dir():
        raise _refuse(
            path, "is neither a folder nor a .csv file", "point it at a folder of class folders or a .csv list"
        )
    elif array_pair(path, "train") is not None:
        found = _from_arrays(path)
    else:
        found = _from_folders(path)
    if not found.splits.get("train"):
        raise _refuse(path, "holds no training images", "add images (image_dir/<class>/*.jpg)")
    return found
