import dataclasses
import functools
import io
import json
import os
import pickle
import subprocess
import sys
import tarfile
import threading
import urllib.error
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from classifier_engine.data import archive
from classifier_engine.data.archive import cache_dir, prepare
from classifier_engine.data.cifar_format import CIFAR10
from classifier_engine.data.errors import DataError

from .conftest import DATASET, cli_env, make_images, write_tiny_archive


def test_conversion_matches_the_archive(tmp_path, fmt):
    write_tiny_archive(tmp_path, fmt, seed=3)
    cache = prepare(tmp_path, fmt, download=False, verify_checksum=False)
    train_images, train_labels = make_images(192, len(fmt.class_names), 3)
    images = np.load(cache.split("train").images, mmap_mode="r")
    assert isinstance(images, np.memmap) and images.dtype == np.uint8 and images.shape == (192, 3, 32, 32)
    assert np.array_equal(images, train_images)
    assert np.array_equal(np.load(cache.split("train").labels), train_labels)
    assert np.load(cache.split("test").labels).dtype == np.int64
    assert cache.class_names == fmt.class_names


def test_a_complete_cache_is_reused_not_rebuilt(data_dir, monkeypatch):
    prepare(data_dir, DATASET, download=False, verify_checksum=False)
    monkeypatch.setattr(archive, "convert_archive", lambda *a: pytest.fail("the cache was rebuilt"))
    prepare(data_dir, DATASET, download=False, verify_checksum=False)


@pytest.mark.parametrize(
    "damage", ["no marker", "other archive", "old format", "missing array", "truncated array", "bytes overwritten"]
)
def test_an_incomplete_or_stale_cache_is_rebuilt(data_dir, damage):
    cache = prepare(data_dir, DATASET, download=False, verify_checksum=False)
    marker = cache.root / "meta.json"
    meta = json.loads(marker.read_text())
    if damage == "no marker":
        marker.unlink()
    elif damage == "missing array":
        cache.split("test").images.unlink()
    elif damage in ("truncated array", "bytes overwritten"):  # a full disk, a crash, a stray write since packing
        images = cache.split("test").images
        whole = bytearray(images.read_bytes())
        whole[-4:] = bytes(255 - value for value in whole[-4:])
        images.write_bytes(whole[:-1000] if damage == "truncated array" else bytes(whole))
        assert archive.load_cache(data_dir, DATASET) is None and archive.cache_damage(data_dir, DATASET)
    else:
        meta["archive_md5" if damage == "other archive" else "format_version"] = "stale"
        marker.write_text(json.dumps(meta))
    rebuilt = prepare(data_dir, DATASET, download=False, verify_checksum=False)
    real_md5 = archive.calculate_md5(str(data_dir / DATASET.archive_name))
    assert json.loads((rebuilt.root / "meta.json").read_text())["archive_md5"] == real_md5
    assert json.loads((rebuilt.root / "meta.json").read_text())["format_version"] == archive.CACHE_FORMAT_VERSION
    assert np.load(rebuilt.split("test").images).shape == (64, 3, 32, 32)


def test_a_changed_archive_invalidates_the_cache(data_dir):
    first = prepare(data_dir, DATASET, download=False, verify_checksum=False)
    write_tiny_archive(data_dir, seed=9)
    second = prepare(data_dir, DATASET, download=False, verify_checksum=False)
    assert second.archive_md5 != first.archive_md5
    assert np.array_equal(np.load(second.split("train").labels), make_images(192, len(DATASET.class_names), 9)[1])


def test_leftovers_of_a_killed_conversion_are_removed(data_dir):
    leftover = data_dir / f".partial-99999.{DATASET.name}-uint8"
    leftover.mkdir()
    (leftover / "train_images.npy").write_bytes(b"half")
    half_download = data_dir / f".partial-99998.{DATASET.archive_name}"
    half_download.write_bytes(b"half")
    other_dataset = data_dir / ".partial-99997.some-other-dataset-uint8"  # not this preparer's to judge
    other_dataset.mkdir()
    prepare(data_dir, DATASET, download=False, verify_checksum=False)
    assert not leftover.exists() and not half_download.exists()
    assert other_dataset.exists()


def test_checksum_mismatch_names_file_sums_and_option(data_dir):
    path = data_dir / DATASET.archive_name
    with pytest.raises(DataError) as error:
        prepare(data_dir, DATASET, download=False, verify_checksum=True)
    message = str(error.value)
    assert str(path) in message and DATASET.md5 in message and "data.verify_checksum" in message
    assert archive.calculate_md5(str(path)) in message
    assert not cache_dir(data_dir, DATASET).exists()


def test_a_truncated_archive_is_refused_and_leaves_no_cache(data_dir):
    path = data_dir / DATASET.archive_name
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(DataError, match=f"{DATASET.archive_name} is damaged"):
        prepare(data_dir, DATASET, download=False, verify_checksum=False)
    assert sorted(p.name for p in data_dir.iterdir() if not p.name.startswith(".")) == [DATASET.archive_name]


def test_a_foreign_pickle_in_the_archive_is_refused(tmp_path):
    write_tiny_archive(tmp_path, CIFAR10)
    path = tmp_path / CIFAR10.archive_name
    with tarfile.open(path) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    files[CIFAR10.member("test_batch")] = pickle.dumps({"data": os.system}, protocol=2)
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(DataError, match="refusing to load"):
        prepare(tmp_path, CIFAR10, download=False, verify_checksum=False)


def test_missing_archive_without_download_says_where_to_put_it(tmp_path):
    with pytest.raises(DataError) as error:
        prepare(tmp_path, CIFAR10, download=False, verify_checksum=True)
    assert str(tmp_path / CIFAR10.archive_name) in str(error.value) and CIFAR10.url in str(error.value)


def test_failed_download_says_where_to_put_it_and_leaves_nothing(tmp_path, monkeypatch):
    def offline(url, root, filename):
        with open(os.path.join(root, filename), "wb") as partial:
            partial.write(b"half a download")
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(archive, "download_url", offline)
    with pytest.raises(DataError) as error:
        prepare(tmp_path, CIFAR10, download=True, verify_checksum=True)
    assert "no network" in str(error.value) and CIFAR10.url in str(error.value)
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == []


@pytest.fixture
def mirror(tmp_path):
    """A local HTTP server (loopback only) serving a tiny archive, standing in for the official host."""
    source = write_tiny_archive(tmp_path / "mirror", CIFAR10)
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(source.parent))
    handler.log_message = lambda *args: None
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield source, f"http://127.0.0.1:{server.server_port}/{source.name}"
    server.shutdown()
    server.server_close()


def test_download_fetches_verifies_and_converts(tmp_path, mirror):
    source, url = mirror
    mirrored = dataclasses.replace(CIFAR10, url=url, md5=archive.calculate_md5(str(source)))
    cache = prepare(tmp_path / "data", mirrored, download=True, verify_checksum=True)
    assert (tmp_path / "data" / CIFAR10.archive_name).read_bytes() == source.read_bytes()
    assert len(np.load(cache.split("test").labels)) == 64


def test_a_download_with_the_wrong_checksum_is_discarded(tmp_path, mirror):
    _, url = mirror
    with pytest.raises(DataError, match="expected"):
        prepare(tmp_path / "data", dataclasses.replace(CIFAR10, url=url), download=True, verify_checksum=True)
    assert not (tmp_path / "data").exists()  # the folder it had to make is gone again, lock file and all


def test_a_missing_folder_is_not_created_when_nothing_may_be_downloaded(tmp_path):
    with pytest.raises(DataError, match=r"data\.download is false"):
        prepare(tmp_path / "typo" / "data", CIFAR10, download=False, verify_checksum=True)
    assert list(tmp_path.iterdir()) == []


def test_the_library_imports_without_posix_only_modules():
    """Windows has no fcntl: the locks take msvcrt there, so the data path and the CLI import there too."""
    windows = (
        "import sys, types; sys.modules['fcntl'] = None; sys.modules['msvcrt'] = types.ModuleType('msvcrt'); "
        "from classifier_engine.foundation import file_lock; assert file_lock.fcntl is None; "
        "del sys.modules['msvcrt']; import classifier_engine.data, classifier_engine.cli.trainer_cli"
    )
    result = subprocess.run([sys.executable, "-c", windows], capture_output=True, text=True, timeout=300, env=cli_env())
    assert result.returncode == 0, result.stderr[-2000:]
