"""Where your labelled images are: class folders, split folders, a CSV list, or arrays.

``find_images(path)`` reads the layout without decoding anything (a walk of the folder and a
``stat`` of each file) and returns every image with its class and the split it was given in:

- ``path/<class>/**``: one split, ``train``; validation (and test) images are held out later by a
  seeded, stratified split (``ImageFolderDataModule``'s ``val_fraction``, ``test_fraction``).
- ``path/{train,val,test}/<class>/**``: the splits as given (``val``/``valid``/``validation`` and
  ``test`` optional; a class absent from ``val`` or ``test`` is fine, one only outside ``train`` is not).
- ``path`` is a ``.csv`` file of ``path,label`` rows (an optional third column ``split``, and under a header an
  optional column ``group``: the subject, patient or session an image shows, kept in one fold; paths
  relative to the CSV, a missing suffix found; a header row is recognized by its first column's
  name: ``path``, ``image``, ``image_name``, ``file``, ...). Several labels in one cell, separated
  by spaces (``path,labels``, as Kaggle's Planet set writes ``tags``), or a header
  ``path,<class>,<class>,...`` over 0/1 cells (optionally a ``split`` column) make it multi-label.
  A list is data from anywhere: a path that leads outside the list's folder (``..``, an absolute
  path, a symbolic link) is refused unless ``allow_outside`` says the list is trusted to.
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
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from lightning.pytorch.utilities import rank_zero_info

from .errors import DataSettingError
from .image_files import IMAGE_SUFFIXES, is_image_file

SPLIT_FOLDERS = {"train": "train", "val": "val", "valid": "val", "validation": "val", "test": "test"}
SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class Entry:
    """One image: its file (relative to the source's root) or its row in an array file, and its class."""

    key: str  # "cats/001.jpg", or "train_images.npy:17"
    label: int | tuple[int, ...]  # the class, or (multi-label) the classes present
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
    task: str = "multiclass"  # or "multilabel": each entry's label is a tuple of classes
    groups: dict[str, str] = field(default_factory=dict)  # a CSV list's group column: key -> group

    def pooled(self) -> LabelledImages:
        """The same images with a given ``val`` split dealt into ``train`` (cross-validation folds them all)."""
        if "val" not in self.splits:
            return self
        splits = {split: entries for split, entries in self.splits.items() if split != "val"}
        splits["train"] = [*self.splits["train"], *self.splits["val"]]
        return replace(self, splits=splits)

    def count(self) -> int:
        return sum(len(entries) for entries in self.splits.values())

    def class_counts(self, split: str = "train") -> list[int]:
        """Images of each class in ``split`` (multi-label: images the class is present in)."""
        counts = np.zeros(len(self.class_names), dtype=np.int64)
        for entry in self.splits.get(split, []):
            counts[list(entry.label) if isinstance(entry.label, tuple) else entry.label] += 1
        return [int(count) for count in counts]

    def as_multilabel(self) -> LabelledImages:
        """The same images with each class as a one-label set (``data.task: multilabel`` on single-label data)."""
        splits = {
            split: [
                replace(entry, label=entry.label if isinstance(entry.label, tuple) else (entry.label,))
                for entry in entries
            ]
            for split, entries in self.splits.items()
        }
        return replace(self, splits=splits, task="multilabel")


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


HEADER_NAMES = {"path", "image", "image_name", "image_id", "image_path", "file", "filename", "file_name", "id"}
LABEL_HEADER = {"label", "class", "category"}  # one label per cell, spaces and all
LABELS_HEADER = {"labels", "tags", "classes", "categories"}  # several, separated by spaces (Planet's tags)
LABEL_SEPARATORS = "|;,"  # in a file whose cells hold one: "Film Noir|Drama"; else spaces, as Planet's tags
PRESENT, ABSENT = {"1", "1.0", "true", "yes"}, {"0", "0.0", "false", "no", ""}


def _image_path(base: Path, name: str) -> Path:
    """The file a row names (relative to ``base``); a name without a suffix may leave out .jpg, .png, ..."""
    path = Path(name) if Path(name).is_absolute() else base / name
    if not path.suffix and not path.is_file():
        found = next((path.with_suffix(s) for s in IMAGE_SUFFIXES if path.with_suffix(s).is_file()), None)
        return found or path
    return path


def _image_base(root: Path, name: str) -> Path:
    """Where a CSV's names are relative to: its folder, or the one folder in it that holds the named image.

    Kaggle's lists sit beside the folder of their images (``train_classes.csv`` and ``train-jpg/``, names
    without a folder or a suffix).
    """
    if Path(name).is_absolute() or _image_path(root, name).is_file():
        return root
    holding = [folder for folder in sorted(root.iterdir()) if folder.is_dir() and _image_path(folder, name).is_file()]
    return holding[0] if len(holding) == 1 else root


def _csv_rows(csv_path: Path) -> tuple[Path, list[str] | None, list[list[str]]]:
    """(the folder the names are relative to, the header row or None, the data rows), cells stripped.

    The first row is a header when its first cell is a usual column name, or names no image while the
    second row's does.
    """
    with open(csv_path, newline="", encoding="utf-8-sig") as handle:
        rows = [[cell.strip() for cell in row] for row in csv.reader(handle) if row and any(c.strip() for c in row)]
    if not rows:
        return csv_path.parent, None, []
    base = _image_base(csv_path.parent, rows[1][0] if len(rows) > 1 else rows[0][0])
    named = rows[0][0].lower() in HEADER_NAMES
    above_images = len(rows) > 1 and _image_path(base, rows[1][0]).is_file()
    if named or (above_images and not _image_path(base, rows[0][0]).is_file()):
        return base, rows[0], rows[1:]
    return base, None, rows


def _spaces_separate(cells: list[str]) -> bool:
    """Whether spaces separate labels in these cells or belong to class names ("golden retriever").

    Sets of labels outnumber the labels (Planet: hundreds of tag sets of 17 tags), or a cell of several
    words is made of words that are labels on their own; class names with spaces give neither.
    """
    whole = {cell for cell in cells if cell}
    words = {word for cell in whole for word in cell.split()}
    return len(whole) > len(words) or any(len(c.split()) > 1 and set(c.split()) <= whole for c in whole)


def _label_column(header: list[str] | None) -> int | None:
    """The column of the labels: one named like ``labels``, else the one beside ``split`` and ``group``; None for
    one 0/1 column per class."""
    named = next((i for i, name in enumerate(header or []) if name.lower() in LABEL_HEADER | LABELS_HEADER), None)
    if named is not None or header is None:
        return named or 1
    others = [i for i, name in enumerate(header) if i and name.lower() not in ("split", "group")]
    return (others or [1])[0] if len(others) < 2 else None


def _one_hot_labels(csv_path: Path, header: list[str], rows: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    """(the classes, each row's labels) of a ``path,<class>,<class>,...`` CSV of 0/1 cells."""
    columns = [(i, name) for i, name in enumerate(header) if i and name.lower() not in ("split", "group")]
    tags = []
    for number, row in enumerate(rows, 1):
        given = []
        for i, name in columns:
            cell = row[i].lower() if i < len(row) else ""
            if cell not in PRESENT | ABSENT:
                raise _refuse(csv_path, f"row {number} has {row[i]!r} in the column {name}", "write 0 or 1 per class")
            if cell in PRESENT:
                given.append(name)
        tags.append(given)
    return [name for _, name in columns], tags


def _outside(path: Path, root: Path) -> bool:
    """Whether ``path``, its symbolic links followed, lies outside the folder ``root`` (as tarfile's data filter)."""
    return not path.resolve().is_relative_to(root.resolve())


def _from_csv(csv_path: Path, task: str, allow_outside: bool = False) -> LabelledImages:
    """A ``path,label`` list (several labels per cell: multi-label), or one 0/1 column per class."""
    root = csv_path.parent
    base, header, rows = _csv_rows(csv_path)
    if not rows:
        raise _refuse(csv_path, "lists no images", "write one 'path,label' row per image")
    named_split = [i for i, name in enumerate(header or []) if name.lower() == "split"]
    split_column = named_split[0] if named_split else (2 if header is None else None)
    group_column = next((i for i, name in enumerate(header or []) if name.lower() == "group"), None)
    label_column = _label_column(header)
    if label_column is None:
        class_names, tags = _one_hot_labels(csv_path, header or [], rows)
        how, spaces_note = "one 0/1 column per class", ""
    else:
        cells = [row[label_column] if len(row) > label_column else "" for row in rows]
        separator = next((mark for mark in LABEL_SEPARATORS if any(mark in cell for cell in cells)), None)
        plural = header is not None and header[label_column].lower() in LABELS_HEADER
        guessed = not separator and not plural and task == "auto" and header is None and _spaces_separate(cells)
        if separator or plural or guessed or task == "multilabel":
            tags = [[tag.strip() for tag in cell.split(separator) if tag.strip()] for cell in cells]
        else:
            tags = [[cell] if cell else [] for cell in cells]
        spaces_note = "; class names with spaces: set data.task multiclass" if guessed else ""
        class_names = _sorted_labels({tag for given in tags for tag in given})
        how = "rows with several labels"
    several = next((number for number, given in enumerate(tags, 1) if len(given) > 1), None)
    multilabel = task == "multilabel" or (task == "auto" and (label_column is None or several is not None))
    if not multilabel:
        if several is not None:
            raise _refuse(
                csv_path,
                f"row {several} gives {len(tags[several - 1])} labels and data.task is multiclass",
                "set data.task: multilabel (or auto) to train on several labels per image",
            )
        bad = next((number for number, given in enumerate(tags, 1) if not given), None)
        if bad is not None:
            raise _refuse(csv_path, f"row {bad} has no label", "write 'path,label' (and optionally ',split') per row")
    _check_classes(csv_path, class_names)
    index = {name: position for position, name in enumerate(class_names)}
    splits: dict[str, list[Entry]] = {}
    groups: dict[str, str] = {}
    for number, (row, given) in enumerate(zip(rows, tags, strict=True), 1):
        path = _image_path(base, row[0])
        if not path.is_file():
            where = "" if base == root else f" in {base.name}/"
            raise _refuse(csv_path, f"row {number} names {row[0]}, which does not exist{where}", "fix the path")
        if not allow_outside and _outside(path, root):
            raise _refuse(
                csv_path,
                f"row {number} names {row[0]}, which lies outside {root.name or root}/, the list's folder",
                "move the images into that folder, or set data.allow_paths_outside true if you trust the list",
            )
        cell = row[split_column] if split_column is not None and len(row) > split_column else ""
        split = SPLIT_FOLDERS.get(cell.lower(), "") if cell else "train"
        if not split:
            raise _refuse(csv_path, f"row {number} has the split {cell!r}", "use train, val or test")
        stat = path.stat()
        label = tuple(sorted(index[tag] for tag in set(given))) if multilabel else index[given[0]]
        key = Path(os.path.relpath(path, root)).as_posix()
        splits.setdefault(split, []).append(Entry(key, label, stat.st_size, stat.st_mtime_ns))
        if group_column is not None and len(row) > group_column and row[group_column]:
            groups[key] = row[group_column]
    if "train" not in splits:
        raise _refuse(csv_path, "has no training rows", "leave the split column empty or 'train' for training images")
    kind = "multilabel" if multilabel else "multiclass"
    found = LabelledImages(root, "csv", class_names, splits, task=kind, groups=groups)
    if base != root:
        rank_zero_info(f"Data: {csv_path.name} names images in {base.name}/")
    if multilabel and task == "auto":
        rank_zero_info(
            f"Data: {csv_path.name} gives {how}: data.task is multilabel (one sigmoid per class){spaces_note}"
        )
    return found


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


def find_images(path: Path, task: str = "auto", allow_outside: bool = False) -> LabelledImages:
    """Every labelled image under ``path`` (see the module's docstring); one ``DataSettingError`` line if none.

    ``task``: auto (multi-label when a CSV gives several labels per image or 0/1 class columns),
    multiclass or multilabel (every image a set of labels, even one each). ``allow_outside``: a CSV may
    name images outside its folder.
    """
    path = Path(path).expanduser()
    if path.is_file() and path.suffix.lower() == ".csv":
        found = _from_csv(path, task, allow_outside)
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
    return found.as_multilabel() if task == "multilabel" and found.task != "multilabel" else found
