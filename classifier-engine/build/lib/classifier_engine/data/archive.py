"""Get the official archive, check it, and convert it once into memory-mappable arrays.

The cache is a converted copy (``foundation/converted_copy.py``): built beside its final place,
renamed into place only when complete, one converter at a time. A cache whose marker is missing,
from another format version, or from another archive is rebuilt, never trusted, so a killed
conversion can never be read back as data; one whose arrays changed since (a full disk, a crash, a
stray write) is rebuilt from the archive before any run reads it, or refused in one line when the
archive is gone.
"""

from __future__ import annotations

import logging
import tarfile
import urllib.error
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from lightning.pytorch.utilities import rank_zero_info
from torchvision.datasets.utils import calculate_md5, download_url

from ..foundation.converted_copy import ConvertedCopy, SplitArrays
from ..foundation.files import NewFolders, Partial, writable
from .cifar_format import IMAGE_SHAPE, ROW_LENGTH, CifarFormat, read_batch
from .errors import DataError

log = logging.getLogger(__name__)

CACHE_FORMAT_VERSION = 1
SPLITS = ("train", "test")
REPACK = "delete it and run again to download the official archive, or repack your data in the CIFAR format"


@dataclass(frozen=True)
class Cache:
    """A complete, converted dataset folder."""

    root: Path
    class_names: tuple[str, ...]
    archive_md5: str

    def split(self, name: str) -> SplitArrays:
        return SplitArrays.in_folder(self.root, name)


def archive_path(data_dir: Path, fmt: CifarFormat) -> Path:
    return Path(data_dir) / fmt.archive_name


def cache_dir(data_dir: Path, fmt: CifarFormat) -> Path:
    return Path(data_dir) / f"{fmt.name}-uint8"


def converted_copy(data_dir: Path, fmt: CifarFormat) -> ConvertedCopy:
    """The cache as a converted copy; its lock (``.<dataset>.lock``) also guards the archive's download."""
    return ConvertedCopy(cache_dir(data_dir, fmt), lock_name=fmt.name)


def _missing_archive_message(path: Path, fmt: CifarFormat, reason: str) -> str:
    return (
        f"{fmt.title} archive not found at {path} ({reason}); download {fmt.url} "
        f"on a machine with network access and place it at {path}, or point data.data_dir "
        "at the folder that holds it"
    )


def ensure_archive(data_dir: Path, fmt: CifarFormat, *, download: bool, verify_checksum: bool) -> tuple[Path, str]:
    """Return the archive's path and MD5, downloading it first if it is absent and allowed.

    A download goes to a temporary name and is renamed only once complete and verified.
    """
    path = archive_path(data_dir, fmt)
    if not path.is_file():
        if not download:
            raise DataError(_missing_archive_message(path, fmt, "and data.download is false"))
        path.parent.mkdir(parents=True, exist_ok=True)
        with Partial(path) as partial:
            try:
                download_url(fmt.url, root=str(partial.parent), filename=partial.name)
            except (urllib.error.URLError, OSError, RuntimeError) as error:
                raise DataError(_missing_archive_message(path, fmt, f"downloading failed: {error}")) from error
            md5 = calculate_md5(str(partial))
            if verify_checksum and md5 != fmt.md5:
                raise DataError(f"the download of {fmt.url} has MD5 {md5}, expected {fmt.md5}; run again to retry")
        return path, md5  # checked above: no second pass over the file
    md5 = calculate_md5(str(path))
    if verify_checksum and md5 != fmt.md5:
        raise DataError(
            f"{path} has MD5 {md5}, but the official {fmt.title} archive has {fmt.md5}; "
            "if the file is damaged, delete it and run again to download it afresh; if it is your own "
            "data packed in the CIFAR format, set data.verify_checksum to false"
        )
    return path, md5


def cache_damage(data_dir: Path, fmt: CifarFormat) -> str | None:
    """What is wrong with a converted cache whose arrays changed since conversion; None if whole (or absent)."""
    copy = converted_copy(data_dir, fmt)
    meta = copy.marker()
    return copy.damage(meta) if meta is not None else None


def load_cache(data_dir: Path, fmt: CifarFormat, archive_md5: str | None = None) -> Cache | None:
    """Return the converted cache if it is complete and whole (and made from ``archive_md5``, if given)."""
    copy = converted_copy(data_dir, fmt)
    meta = copy.whole()
    if meta is None:
        return None
    if meta.get("format_version") != CACHE_FORMAT_VERSION or meta.get("dataset") != fmt.name:
        return None
    if archive_md5 is not None and meta.get("archive_md5") != archive_md5:
        return None
    cache = Cache(copy.folder, tuple(meta["class_names"]), meta["archive_md5"])
    if not all(path.is_file() for split in SPLITS for path in vars(cache.split(split)).values()):
        return None
    return cache


def _no_source_message(data_dir: Path, fmt: CifarFormat) -> str:
    """The archive is not there and may not be downloaded; say so, and why the converted copy cannot stand in."""
    damaged = cache_damage(data_dir, fmt)
    reason = "and data.download is false"
    if damaged is not None:
        reason += f"; the converted copy in {cache_dir(data_dir, fmt)} cannot be used alone: {damaged}"
    return _missing_archive_message(archive_path(data_dir, fmt), fmt, reason)


def _read_member(tar: tarfile.TarFile, archive: Path, member: str) -> dict[str, object]:
    try:
        handle = tar.extractfile(member)
        raw = handle.read() if handle is not None else None
    except KeyError:
        raise DataError(
            f"{archive} has no member {member!r}, so it is damaged or not an archive of data.dataset's kind; "
            "delete it and run again to download it afresh, or set data.dataset to the kind it is"
        ) from None
    except (tarfile.TarError, EOFError, OSError, zlib.error) as error:
        raise DataError(f"{archive} is damaged ({error}); delete it and run again to download it afresh") from error
    if raw is None:
        raise DataError(f"{archive}: {member!r} is not a regular file; {REPACK}")
    try:
        return read_batch(raw)
    except Exception as error:  # a corrupt pickle raises many different types
        raise DataError(f"{archive}: cannot read {member!r} as a CIFAR batch ({error}); {REPACK}") from error


def _read_split(tar: tarfile.TarFile, archive: Path, fmt: CifarFormat, files: tuple[str, ...], num_classes: int):
    images, labels = [], []
    for file_name in files:
        member = fmt.member(file_name)
        batch = _read_member(tar, archive, member)
        try:
            data = np.asarray(batch["data"])
            targets = np.asarray(batch[fmt.labels_key], dtype=np.int64)
        except KeyError as error:
            raise DataError(f"{archive}: {member!r} lacks the key {error}; {REPACK}") from None
        if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != ROW_LENGTH or len(targets) != len(data):
            raise DataError(
                f"{archive}: {member!r} holds data {data.dtype}{data.shape} with {len(targets)} labels; "
                f"expected uint8 (N, {ROW_LENGTH}) rows with N labels; {REPACK}"
            )
        if len(targets) and (targets.min() < 0 or targets.max() >= num_classes):
            raise DataError(f"{archive}: {member!r} has labels outside 0..{num_classes - 1}; {REPACK}")
        images.append(data.reshape(-1, *IMAGE_SHAPE))
        labels.append(targets)
    return np.concatenate(images), np.concatenate(labels)


def _open_tar(archive: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(archive, "r:*")
    except (tarfile.TarError, OSError) as error:
        raise DataError(
            f"{archive} is not a readable tar archive ({error}); delete it and run again to download it afresh"
        ) from error


def convert_archive(archive: Path, archive_md5: str, data_dir: Path, fmt: CifarFormat) -> Cache:
    """Convert the archive's batches into ``.npy`` arrays, atomically replacing any old cache."""
    copy = converted_copy(data_dir, fmt)

    def write(partial: Path) -> dict:
        with _open_tar(archive) as tar:
            meta = _read_member(tar, archive, fmt.member(fmt.meta_file))
            class_names = tuple(str(name) for name in meta.get(fmt.names_key, ()))
            if not class_names:
                raise DataError(f"{archive}: {fmt.meta_file!r} has no {fmt.names_key!r}; {REPACK}")
            counts = {}
            for split, files in zip(SPLITS, (fmt.train_files, fmt.test_files), strict=True):
                images, labels = _read_split(tar, archive, fmt, files, len(class_names))
                np.save(partial / f"{split}_images.npy", images)
                np.save(partial / f"{split}_labels.npy", labels)
                counts[split] = len(labels)
        return {
            "format_version": CACHE_FORMAT_VERSION,
            "dataset": fmt.name,
            "archive_md5": archive_md5,
            "class_names": list(class_names),
            "counts": counts,
        }

    marker = copy.build(write)
    log.info("converted %s into %s (%s)", archive, copy.folder, marker["counts"])
    return Cache(copy.folder, tuple(marker["class_names"]), archive_md5)


def _read_only_message(data_dir: Path, fmt: CifarFormat) -> str:
    return (
        f"data.data_dir {data_dir} cannot be written (read-only or no permission) and holds no complete converted "
        f"{fmt.title} copy to read; run once where that folder can be written, or point data.data_dir at a "
        "writable copy of it"
    )


def _read_only_cache(data_dir: Path, fmt: CifarFormat, verify_checksum: bool) -> Cache:
    """The complete cache of a folder this process cannot write, which it may only read; else a one-line refusal."""
    archive = archive_path(data_dir, fmt)
    md5 = (
        ensure_archive(data_dir, fmt, download=False, verify_checksum=verify_checksum)[1] if archive.is_file() else None
    )
    cache = load_cache(data_dir, fmt, archive_md5=md5)
    if cache is None:
        raise DataError(_read_only_message(data_dir, fmt))
    return cache


def fingerprint(data_dir: Path, fmt: CifarFormat, *, download: bool = True, verify_checksum: bool = True) -> str:
    """What the data is, whatever folder it lies in: the dataset's name and its archive's MD5.

    A checked archive is the official one (a different file is refused before training), so its
    MD5 need not be computed; your own archive's is; without an archive, the converted cache
    records the MD5 it was made from; data still to be downloaded will be the official archive,
    and data neither here nor to be downloaded is refused at once.
    """
    archive = archive_path(data_dir, fmt)
    if archive.is_file():
        md5 = fmt.md5 if verify_checksum else calculate_md5(str(archive))
    else:
        cache = load_cache(data_dir, fmt)
        if cache is None and not download:
            raise DataError(_no_source_message(data_dir, fmt))
        md5 = cache.archive_md5 if cache is not None else fmt.md5
    if Path(data_dir).is_dir() and not writable(data_dir):  # refused before anything is built
        _read_only_cache(data_dir, fmt, verify_checksum)
    return f"{fmt.name}:{md5}"


def prepare(data_dir: Path, fmt: CifarFormat, *, download: bool = True, verify_checksum: bool = True) -> Cache:
    """Make sure a complete cache built from the archive in ``data_dir`` exists; return it.

    Without the archive, a complete cache alone is used as is (the archive may be deleted
    after conversion to save space). A folder this call had to create is removed again if
    preparing fails, and none is created when there is nothing to download into it.
    """
    data_dir = Path(data_dir)
    if data_dir.is_dir() and not writable(data_dir):  # a shared, read-only copy: read it, take no lock
        return _read_only_cache(data_dir, fmt, verify_checksum)
    if not data_dir.is_dir():
        if not download:
            raise DataError(_no_source_message(data_dir, fmt))
        with NewFolders(data_dir):
            return _prepare_in(data_dir, fmt, download=download, verify_checksum=verify_checksum)
    return _prepare_in(data_dir, fmt, download=download, verify_checksum=verify_checksum)


def _prepare_in(data_dir: Path, fmt: CifarFormat, *, download: bool, verify_checksum: bool) -> Cache:
    # One preparer at a time per data folder and dataset: the download and the conversion.
    with converted_copy(data_dir, fmt).making(fmt.archive_name):
        if not archive_path(data_dir, fmt).is_file():
            cache = load_cache(data_dir, fmt)
            if cache is not None:
                return cache
            if not download:
                raise DataError(_no_source_message(data_dir, fmt))
        archive, md5 = ensure_archive(data_dir, fmt, download=download, verify_checksum=verify_checksum)
        cache = load_cache(data_dir, fmt, archive_md5=md5)
        if cache is None:
            damaged = cache_damage(data_dir, fmt)
            if damaged is not None:
                rank_zero_info(f"Data: {cache_dir(data_dir, fmt)} is damaged ({damaged}); converting {archive} again")
            cache = convert_archive(archive, md5, data_dir, fmt)
        return cache
