import pickle
import pickletools
import tarfile
import time

import numpy as np
import pytest
import torchvision

from classifier_engine.data.cifar_format import CIFAR10, read_batch
from classifier_engine.testing.cifar_archives import write_archive

from .conftest import NUM_TEST, NUM_TRAIN, make_images, write_tiny_archive


def members(path):
    with tarfile.open(path) as tar:
        return {member.name: tar.extractfile(member).read() for member in tar.getmembers()}


def test_archive_has_the_official_layout(tmp_path, fmt):
    files = members(write_tiny_archive(tmp_path, fmt))
    expected = {fmt.member(name) for name in (*fmt.train_files, *fmt.test_files, fmt.meta_file)}
    assert expected <= set(files)
    batch = pickle.loads(files[fmt.member(fmt.train_files[0])], encoding="latin1")
    assert {"data", fmt.labels_key, "batch_label", "filenames"} <= set(batch)
    assert batch["data"].dtype == np.uint8 and batch["data"].shape[1] == 3072
    meta = pickle.loads(files[fmt.member(fmt.meta_file)], encoding="latin1")
    assert meta[fmt.names_key] == list(fmt.class_names)


def test_torchvisions_own_reader_reads_a_written_archive(tmp_path, fmt):
    # torchvision's class as it is, but with its per-file MD5s of the official archive set to None
    # ("must exist"): written images are not the official ones, and that is all this changes.
    official = torchvision.datasets.CIFAR10 if fmt.name == "cifar10" else torchvision.datasets.CIFAR100
    reader = type(
        "AnyArchive",
        (official,),
        {
            "train_list": [[name, None] for name, _ in official.train_list],
            "test_list": [[name, None] for name, _ in official.test_list],
            "meta": {**official.meta, "md5": None},
        },
    )
    with tarfile.open(write_tiny_archive(tmp_path, fmt)) as tar:
        tar.extractall(tmp_path, filter="data")
    for train, count, seed in ((True, NUM_TRAIN, 0), (False, NUM_TEST, 1)):
        dataset = reader(str(tmp_path), train=train, download=False)
        images, labels = make_images(count, len(fmt.class_names), seed)
        assert dataset.classes == list(fmt.class_names)
        assert np.array_equal(dataset.data, images.transpose(0, 2, 3, 1))  # torchvision keeps (N, H, W, C)
        assert dataset.targets == labels.tolist()
        first, label = dataset[0]  # through its PIL path
        assert np.array_equal(np.asarray(first), images[0].transpose(1, 2, 0)) and label == labels[0]


def test_the_same_arrays_always_pack_to_the_same_bytes(tmp_path, monkeypatch):
    packed = []
    for clock in (1.0e9, 2.0e9):  # written at different times
        monkeypatch.setattr(time, "time", lambda clock=clock: clock)
        packed.append(write_tiny_archive(tmp_path / str(clock)).read_bytes())
    assert packed[0] == packed[1]


def test_the_archive_is_written_into_a_new_folder_as_the_readme_does(tmp_path):
    train, test = make_images(NUM_TRAIN, 10, 0), make_images(NUM_TEST, 10, 1)
    path = write_archive(tmp_path / "my_data" / "cifar-10-python.tar.gz", CIFAR10, *train, *test)
    assert path.is_file() and set(members(path)) >= {CIFAR10.member(name) for name in CIFAR10.test_files}


def test_batches_are_python2_pickles(tmp_path, fmt):
    raw = members(write_tiny_archive(tmp_path, fmt))[fmt.member(fmt.test_files[0])]
    opcodes = {op.name for op, _, _ in pickletools.genops(raw)}
    assert raw[:2] == b"\x80\x02"  # protocol 2
    assert "SHORT_BINSTRING" in opcodes and "BINSTRING" in opcodes  # py2 str, for keys and pixel bytes
    assert not opcodes & {"BINUNICODE", "SHORT_BINUNICODE", "SHORT_BINBYTES", "BINBYTES"}  # nothing py3-only
    as_bytes = pickle.loads(raw, encoding="bytes")
    assert b"data" in as_bytes and as_bytes[b"data"].shape[1] == 3072


def test_reader_accepts_python3_pickles_and_bytes_keys():
    rows = np.arange(2 * 3072, dtype=np.uint8).reshape(2, 3072)
    for batch in ({"data": rows, "labels": [1, 2]}, {b"data": rows, b"labels": [1, 2]}):
        loaded = read_batch(pickle.dumps(batch, protocol=4))
        assert loaded["labels"] == [1, 2] and np.array_equal(loaded["data"], rows)


def test_reader_refuses_code_in_a_pickle():
    class Exploit:
        def __reduce__(self):
            return (print, ("this must never run",))

    with pytest.raises(pickle.UnpicklingError, match=r"refusing to load (__builtin__|builtins)\.print"):
        read_batch(pickle.dumps({"data": Exploit()}, protocol=2))
