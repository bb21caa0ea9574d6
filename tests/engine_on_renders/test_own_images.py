"""Your own images: decoding, layouts, packing once, the held-out split, and the whole CLI on a generated folder."""

from __future__ import annotations

import csv
import json
import logging
import os
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from cifar_classifier.models import ImageClassifier
from cifar_classifier.models.backbones import AirBench, CifarResNet, FastCNN, build_backbone
from PIL import Image

from classifier_engine import TorchvisionNet
from classifier_engine.data import ImageFolderDataModule, packing
from classifier_engine.data.augment import random_resized_crop
from classifier_engine.data.errors import DataError, DataSettingError
from classifier_engine.data.folder import stratified_split
from classifier_engine.data.image_files import BadImageError, decode_image
from classifier_engine.data.image_sources import find_images
from classifier_engine.data.packing import (
    PackSettings,
    open_packed,
    pack,
    packed_folder,
)
from classifier_engine.foundation.files import NoSpaceError
from classifier_engine.models.labels import loss_weights

from .conftest import PHOTO_ROOT, images_args, run_cli, write_image_folder

RED, BLUE = (255, 0, 0), (0, 0, 255)


def two_colour(path: Path, size: tuple[int, int], **save: object) -> Path:
    """Left half red, right half blue."""
    image = Image.new("RGB", size, BLUE)
    image.paste(RED, (0, 0, size[0] // 2, size[1]))
    image.save(path, **save)
    return path


@pytest.mark.parametrize(
    ("mode", "pixel", "expected"),
    [
        ("L", 128, (128, 128, 128)),
        ("1", 1, (255, 255, 255)),
        ("RGBA", (255, 0, 0, 0), (255, 255, 255)),  # fully transparent: the white background
        ("RGBA", (255, 0, 0, 255), (255, 0, 0)),
        ("LA", (0, 128), (128, 128, 128)),  # half-transparent black over white
        ("CMYK", (0, 255, 255, 0), (255, 0, 0)),
        ("I;16", 65535, (255, 255, 255)),  # 16 bits scaled to 8, not clipped
        ("I;16", 32896, (128, 128, 128)),
    ],
)
def test_every_mode_becomes_8_bit_rgb(tmp_path, mode, pixel, expected):
    path = tmp_path / ("image.tiff" if mode in ("CMYK",) else "image.png")
    Image.new(mode, (20, 10), pixel).save(path)
    pixels = decode_image(path, 8)
    assert pixels.dtype == np.uint8 and pixels.shape == (8, 8, 3)
    assert np.abs(pixels.astype(int) - expected).max() <= 1, pixels[0, 0]


def test_a_palette_image_with_a_transparent_colour_is_flattened_onto_white(tmp_path):
    image = Image.new("P", (10, 10), 1)
    image.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    image.save(tmp_path / "palette.gif", transparency=1)
    assert (decode_image(tmp_path / "palette.gif", 4) == 255).all()


def test_exif_orientation_is_applied_before_resizing(tmp_path):
    image = Image.new("RGB", (40, 20), BLUE)
    image.paste(RED, (0, 0, 20, 20))  # red left half, stored landscape
    exif = Image.Exif()
    exif[0x0112] = 6  # display rotated 90 degrees clockwise: the left half becomes the top half
    image.save(tmp_path / "phone.jpg", exif=exif, quality=100)
    pixels = decode_image(tmp_path / "phone.jpg", 16, "stretch").astype(int)
    assert pixels[2, 8, 0] > 200 and pixels[2, 8, 2] < 60  # top: red
    assert pixels[13, 8, 2] > 200 and pixels[13, 8, 0] < 60  # bottom: blue


def test_the_three_resize_rules(tmp_path):
    path = two_colour(tmp_path / "wide.png", (80, 40))
    cropped, padded, stretched = (decode_image(path, 20, rule).astype(int) for rule in ("crop", "pad", "stretch"))
    assert cropped[10, 2, 0] > 200 and cropped[10, 17, 2] > 200  # the centre square: half red, half blue
    assert (padded[0] == 0).all() and (padded[-1] == 0).all() and padded[10, 2, 0] > 200  # black bars above and below
    assert stretched[0, 2, 0] > 200 and stretched[0, 17, 2] > 200  # no bars


def test_a_large_jpeg_decoded_at_reduced_scale_matches_the_full_decode(tmp_path):
    rng = np.random.default_rng(0)
    smooth = Image.fromarray(rng.integers(0, 255, (12, 16, 3), dtype=np.uint8)).resize((1600, 1200), Image.BICUBIC)
    smooth.save(tmp_path / "photo.jpg", quality=95)
    fast = decode_image(tmp_path / "photo.jpg", 64).astype(int)
    with Image.open(tmp_path / "photo.jpg") as image:  # the whole image decoded, then resized by the same rule
        from PIL import ImageOps

        full = np.asarray(ImageOps.fit(image.convert("RGB"), (64, 64), method=Image.Resampling.BILINEAR)).astype(int)
    assert np.abs(fast - full).mean() < 3


@pytest.mark.parametrize("content", [b"", b"\xff\xd8\xff\xe0 not really a jpeg", b"plain text"])
def test_unreadable_files_are_bad_images(tmp_path, content):
    (tmp_path / "bad.jpg").write_bytes(content)
    with pytest.raises(BadImageError):
        decode_image(tmp_path / "bad.jpg", 8)


def test_a_truncated_jpeg_is_a_bad_image(tmp_path):
    whole = two_colour(tmp_path / "whole.jpg", (200, 200), quality=90).read_bytes()
    (tmp_path / "cut.jpg").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(BadImageError, match="truncated"):
        decode_image(tmp_path / "cut.jpg", 8)


def test_class_folders_skip_hidden_and_other_files_and_follow_subfolders_and_links(tmp_path):
    write_image_folder(tmp_path / "photos", per_class=2)
    (tmp_path / "photos" / "cat" / ".DS_Store").write_bytes(b"junk")
    (tmp_path / "photos" / "cat" / "notes.txt").write_text("not an image")
    (tmp_path / "photos" / ".cache").mkdir()
    nested = tmp_path / "photos" / "dog" / "2024" / "summer"
    nested.mkdir(parents=True)
    two_colour(nested / "beach.JPEG", (30, 30))
    os.symlink(tmp_path / "photos" / "cat" / "000.jpg", tmp_path / "photos" / "dog" / "link.jpg")
    found = find_images(tmp_path / "photos")
    assert found.layout == "class folders" and found.class_names == ["cat", "dog", "fish cake"]
    keys = [entry.key for entry in found.splits["train"]]
    assert "dog/2024/summer/beach.JPEG" in keys and "dog/link.jpg" in keys
    assert not any(".DS_Store" in key or key.endswith(".txt") for key in keys)
    assert found.class_counts() == [2, 4, 2]


def test_split_folders_keep_their_splits(tmp_path):
    write_image_folder(tmp_path / "photos" / "train", per_class=2)
    write_image_folder(tmp_path / "photos" / "val", classes=("cat",), per_class=1)  # a class missing from val is fine
    found = find_images(tmp_path / "photos")
    assert found.layout == "split folders" and sorted(found.splits) == ["train", "val"]
    assert [entry.label for entry in found.splits["val"]] == [0]
    write_image_folder(tmp_path / "photos" / "test", classes=("bird",), per_class=1)
    with pytest.raises(DataSettingError, match="classes in test/ that train/ lacks"):
        find_images(tmp_path / "photos")


def test_a_csv_list_with_relative_paths_and_splits(tmp_path):
    write_image_folder(tmp_path / "pool", per_class=2)
    rows = [["path", "label", "split"], ["pool/cat/000.jpg", "7", ""], ["pool/dog/001.png", "12", "train"]]
    rows += [["pool/fish cake/000.jpg", "7", "val"]]
    with open(tmp_path / "list.csv", "w", newline="") as handle:
        csv.writer(handle).writerows(rows)
    found = find_images(tmp_path / "list.csv")
    assert found.class_names == ["7", "12"]  # numeric labels in numeric order
    assert [entry.key for entry in found.splits["train"]] == ["pool/cat/000.jpg", "pool/dog/001.png"]
    assert [entry.label for entry in found.splits["val"]] == [0]


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_arrays_with_class_names(tmp_path, layout):
    images = np.random.default_rng(0).integers(0, 255, (6, 20, 20, 3), dtype=np.uint8)
    np.save(tmp_path / "images.npy", images if layout == "NHWC" else images.transpose(0, 3, 1, 2))
    np.save(tmp_path / "labels.npy", np.array([0, 1, 0, 1, 0, 1]))
    (tmp_path / "classes.txt").write_text("ant\nbee\n")
    found = find_images(tmp_path)
    assert found.layout == "arrays" and found.class_names == ["ant", "bee"]
    packed = pack(found, PackSettings(20, "crop"), tmp_path / "packed", workers=1)
    assert np.array_equal(np.load(packed.split("train").images), images.transpose(0, 3, 1, 2))


def test_the_from_scratch_config_trains_on_a_folder_of_forty_photos(tmp_path):
    # 36 training images after the validation split: fewer than the config's batch of 256, so the batch is
    # lowered to the split (with a line saying so) instead of the run being refused.
    photos = write_image_folder(tmp_path / "photos", classes=("ant", "bee", "cow", "doe"), per_class=10)
    configs = ["--config", str(PHOTO_ROOT / "configs" / "images.yaml")]
    configs += ["--config", str(PHOTO_ROOT / "configs" / "presets" / "from_scratch.yaml")]
    tiny = ["--trainer.accelerator=cpu", "--trainer.max_epochs=1", "--data.num_workers=0"]
    result = run_cli("fit", *configs, f"--data.image_dir={photos}", *tiny, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert "more than the 36 training images; training with 36 per device instead" in output
    assert "Batch: 36 per device = 36 images per optimizer step" in output


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda root: None, "does not exist"),
        (lambda root: write_image_folder(root, classes=("cat",), per_class=2), "only the class 'cat'"),
        (lambda root: (write_image_folder(root, per_class=1), (root / "empty").mkdir()), "empty class folder empty"),
        (
            lambda root: (root.mkdir(), two_colour(root / "a.jpg", (8, 8)), two_colour(root / "b.jpg", (8, 8))),
            "no class folders",
        ),
        (lambda root: root.mkdir(), "no class folder"),
    ],
    ids=["missing", "one-class", "empty-class", "loose-images", "empty-folder"],
)
def test_unusable_folders_are_refused_in_one_line(tmp_path, make, message):
    make(tmp_path / "photos")
    with pytest.raises(DataSettingError, match=message) as refused:
        find_images(tmp_path / "photos")
    assert str(refused.value).startswith("data.image_dir=") and "\n" not in str(refused.value)


def test_a_csv_naming_a_missing_file_is_refused(tmp_path):
    (tmp_path / "list.csv").write_text("a.jpg,cat\nb.jpg,dog\n")
    with pytest.raises(DataSettingError, match=r"row 1 names a\.jpg, which does not exist"):
        find_images(tmp_path / "list.csv")


def test_packing_is_reused_until_an_image_or_a_setting_changes(tmp_path):
    photos = write_image_folder(tmp_path / "photos", per_class=4)
    settings = PackSettings(16, "crop")
    first = pack(find_images(photos), settings, tmp_path / "packed", workers=2)
    stamp = first.split("train").images.stat().st_mtime_ns
    again = pack(find_images(photos), settings, tmp_path / "packed", workers=2)
    assert again.root == first.root and again.split("train").images.stat().st_mtime_ns == stamp  # nothing decoded
    assert np.load(first.split("train").images).shape == (12, 3, 16, 16)
    assert pack(find_images(photos), PackSettings(24, "crop"), tmp_path / "packed").root != first.root
    assert pack(find_images(photos), PackSettings(16, "pad"), tmp_path / "packed").root != first.root
    two_colour(photos / "dog" / "new.png", (40, 40))
    assert packed_folder(tmp_path / "packed", find_images(photos), settings) != first.root
    os.utime(photos / "cat" / "000.jpg", ns=(1, 1))  # a changed file (its time) is another manifest too
    assert packed_folder(tmp_path / "packed", find_images(photos), settings) != first.root
    assert not list((tmp_path / "packed").glob(".partial-*"))


def test_bad_files_are_left_out_and_listed_or_stop_packing_in_one_line(tmp_path):
    photos = write_image_folder(tmp_path / "photos", per_class=3)
    (photos / "cat" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 broken")
    (photos / "dog" / "empty.png").write_bytes(b"")
    found = find_images(photos)
    packed = pack(found, PackSettings(16, "crop"), tmp_path / "packed", workers=1)
    assert packed.meta["counts"] == {"train": 9} and packed.meta["bad_images"] == 2
    listed = (packed.root / "bad_images.txt").read_text().splitlines()
    assert [line.split("\t")[0] for line in listed] == ["cat/broken.jpg", "dog/empty.png"]
    assert "broken.jpg" not in packed.keys("train")
    with pytest.raises(DataError, match=r"cat/broken.jpg is not a readable image .*on_bad_image: skip"):
        pack(found, PackSettings(20, "crop"), tmp_path / "strict", workers=1, on_bad_image="error")
    assert [path.name for path in (tmp_path / "strict").iterdir() if not path.name.endswith(".lock")] == []


def test_a_packing_that_fails_half_way_leaves_nothing_a_later_run_could_take_for_complete(tmp_path, monkeypatch):
    photos = write_image_folder(tmp_path / "photos", per_class=3)
    calls = []

    def fails_on_the_fifth(task):
        calls.append(task)
        if len(calls) == 5:
            raise OSError(28, "No space left on device")
        return real(task)

    real = packing.decode_task
    monkeypatch.setattr(packing, "decode_task", fails_on_the_fifth)
    with pytest.raises(NoSpaceError, match=r"no space left on the disk of .*packed to write photos-16px-"):
        pack(find_images(photos), PackSettings(16, "crop"), tmp_path / "packed", workers=1)
    assert [path.name for path in (tmp_path / "packed").iterdir() if not path.name.endswith(".lock")] == []
    monkeypatch.setattr(packing, "decode_task", real)
    packed = pack(find_images(photos), PackSettings(16, "crop"), tmp_path / "packed", workers=1)
    assert open_packed(packed.root) is not None and packed.meta["counts"] == {"train": 9}


def test_a_damaged_packed_copy_is_not_taken_for_complete(tmp_path):
    photos = write_image_folder(tmp_path / "photos", per_class=2)
    packed = pack(find_images(photos), PackSettings(16, "crop"), tmp_path / "packed", workers=1)
    images = packed.split("train").images
    whole = images.read_bytes()
    images.write_bytes(whole[:-100])  # truncated
    assert open_packed(packed.root) is None
    images.write_bytes(whole[:-4] + bytes(4 * [whole[-1] ^ 0xFF]))  # four bytes overwritten, same size
    assert open_packed(packed.root) is None
    repacked = pack(find_images(photos), PackSettings(16, "crop"), tmp_path / "packed", workers=1)
    assert open_packed(repacked.root) is not None and repacked.split("train").images.read_bytes() == whole


def test_the_held_out_split_is_stratified_seeded_and_disjoint():
    labels = np.repeat(np.arange(4), [50, 10, 3, 2])
    train, val, test = stratified_split(labels, (0.2, 0.1), seed=0)
    assert sorted(np.concatenate([train, val, test]).tolist()) == list(range(len(labels)))
    assert set(labels[val]) == {0, 1, 2, 3}  # every class is validated, even one of two images
    assert set(labels[train]) == {0, 1, 2, 3}  # and keeps at least one image to train on
    assert np.bincount(labels[val]).tolist()[:2] == [10, 2]
    again = stratified_split(labels, (0.2, 0.1), seed=0)
    assert all(np.array_equal(a, b) for a, b in zip((train, val, test), again, strict=True))
    assert not np.array_equal(stratified_split(labels, (0.2, 0.1), seed=1)[1], val)
    # The test split does not move with the validation share: a cross-validation (share 0) and a single-split run
    # of one seed are tested on the same photos (where a class has images enough for every share).
    labels = np.repeat(np.arange(3), [50, 10, 6])
    test = stratified_split(labels, (0.2, 0.1), seed=0)[2]
    for val_share in (0.0, 0.05, 0.3):
        assert np.array_equal(stratified_split(labels, (val_share, 0.1), seed=0)[2], test)


def test_the_random_resized_crop_keeps_shape_and_dtype_and_is_seeded():
    images = torch.randint(0, 256, (5, 3, 64, 64), dtype=torch.uint8)
    first = random_resized_crop(images, (0.35, 1.0), torch.Generator().manual_seed(0))
    second = random_resized_crop(images, (0.35, 1.0), torch.Generator().manual_seed(0))
    assert first.shape == images.shape and first.dtype == torch.uint8 and torch.equal(first, second)
    assert not torch.equal(first[0], first[1][None].expand(1, -1, -1, -1)[0]) and not torch.equal(first, images)
    plain = torch.full((3, 3, 64, 64), 77, dtype=torch.uint8)  # any box of a plain image is the same plain image
    assert torch.equal(random_resized_crop(plain, (0.35, 1.0), torch.Generator().manual_seed(0)), plain)


def test_images_packed_with_an_evaluation_margin_train_on_all_of_it_and_evaluate_on_its_centre(tmp_path):
    # A frame of colour only in the outer ring an evaluation crop of 0.8 leaves out.
    folder = tmp_path / "photos"
    for label in ("framed", "plain"):
        (folder / label).mkdir(parents=True)
        for index in range(8):
            pixels = np.full((80, 80, 3), 100, dtype=np.uint8)
            if label == "framed":
                pixels[:6], pixels[-6:], pixels[:, :6], pixels[:, -6:] = 250, 250, 250, 250
            Image.fromarray(pixels).save(folder / label / f"{index}.png")
    data = ImageFolderDataModule(image_dir=str(folder), image_size=40, crop_pct=0.8, cache_dir=str(tmp_path / "packed"),
                                 val_fraction=0.25, batch_size=4, num_workers=0, random_resized_crop=True)  # fmt: skip
    data.prepare_data()
    data.setup("fit")
    assert data.train_set.arrays[0].shape[-1] == 50  # packed at 40 / 0.8
    images, labels = next(iter(data.train_dataloader()))[:2]
    served = data.on_after_batch_transfer((images, labels), 0)[0]  # no trainer: served as evaluation serves it
    assert served.shape[-2:] == (40, 40) and int(served.max()) == 100  # the centre: no frame
    data.augment.seed(0)
    trained = data.augment(images, epoch=0)
    assert trained.shape[-2:] == (40, 40)
    assert int(trained[labels == 0].max()) > 200  # the random-resized crop reaches into the ring
    held_out = data.held_out_images()
    assert held_out.images[:2].shape[-2:] == (40, 40) and int(held_out.images[:].max()) == 100


@pytest.mark.parametrize("size", [32, 64, 224])
@pytest.mark.parametrize(
    "backbone",
    [
        lambda n: FastCNN(n, width=4),
        lambda n: AirBench(n, width=4),
        lambda n: CifarResNet(n),
        lambda n: TorchvisionNet(n, "resnet18"),
    ],
    ids=["FastCNN", "AirBench", "CifarResNet", "TorchvisionNet"],
)
def test_every_shipped_network_takes_any_size_from_32_to_224(backbone, size):
    network = build_backbone(backbone, 5, size)
    assert network.eval()(torch.zeros(2, 3, size, size)).shape == (2, 5)


def test_a_local_weights_file_initializes_everything_but_the_new_head(tmp_path):
    torch.manual_seed(1)
    reference = torchvision.models.resnet18()
    torch.save(reference.state_dict(), tmp_path / "resnet18.pt")
    network = TorchvisionNet(3, "resnet18", weights_path=str(tmp_path / "resnet18.pt"))
    assert torch.equal(network.network.conv1.weight, reference.conv1.weight)
    assert network.head() is network.network.fc and network.network.fc.out_features == 3
    torch.save(torchvision.models.resnet34().state_dict(), tmp_path / "other.pt")
    with pytest.raises(ValueError, match="are not weights of torchvision's resnet18"):
        TorchvisionNet(3, "resnet18", weights_path=str(tmp_path / "other.pt"))
    with pytest.raises(ValueError, match="not a torchvision classification model"):
        TorchvisionNet(3, "resnet_nineteen")


@pytest.mark.slow  # four process starts and four short epochs
@pytest.mark.every_render  # the own-images route exists whatever the render's default dataset
def test_a_folder_of_photos_trains_tests_predicts_and_exports_through_the_cli(tmp_path):
    photos = write_image_folder(tmp_path / "photos", per_class=24)
    (photos / "cat" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 broken")
    fit = run_cli(*images_args(photos, "--trainer.max_epochs=4"), cwd=tmp_path)
    assert "Data: packed 72 images" in fit.stderr + fit.stdout
    assert "left out 1 unreadable images" in fit.stderr + fit.stdout
    (run,) = tmp_path.glob("runs/images/*/checkpoints/last.ckpt")
    checkpoint = torch.load(run, weights_only=False)
    assert checkpoint["hyper_parameters"]["image_size"] == 32
    assert checkpoint["hyper_parameters"]["class_names"] == ["cat", "dog", "fish cake"]
    # Testing reuses the packed copy and the model's image size, whatever the command says now.
    test = run_cli(
        "test",
        *images_args(photos, "--trainer.max_epochs=4", "--data.image_size=48")[1:],
        "--ckpt_path=last",
        cwd=tmp_path,
        check=False,
    )
    assert test.returncode == 0, test.stderr[-3000:]
    output = test.stdout + test.stderr
    assert "already packed" in output and "nothing to decode" in output and "test/top1" in output
    predict = ["predict", *images_args(photos, "--trainer.max_epochs=4")[1:], "--ckpt_path=last"]
    predict.append(f"--data.predict_dir={photos / 'dog'}")
    run_cli(*predict, cwd=tmp_path)
    (predictions,) = tmp_path.glob("runs/images/*/predict/*/predictions.csv")
    rows = list(csv.DictReader(predictions.read_text().splitlines()))
    assert len(rows) == 24 and rows[0]["image"] == "000.jpg"
    assert sum(row["predicted"] == "dog" for row in rows) >= 18  # the colours are easy to learn
    # The trained model alone predicts a new folder: the training images may be gone.
    photos.rename(tmp_path / "elsewhere")
    moved = [*predict[:-1], f"--data.predict_dir={tmp_path / 'elsewhere' / 'cat'}"]
    assert "Predictions:" in run_cli(*moved, cwd=tmp_path).stdout
    (tmp_path / "elsewhere").rename(photos)
    import subprocess
    import sys

    from .conftest import cli_env

    exported = subprocess.run(
        [sys.executable, str(PHOTO_ROOT / "export.py"), f"--ckpt_path={run}", "--max_int8_drop=100"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=300,
    )
    assert exported.returncode == 0, exported.stderr[-3000:]
    card = json.loads((run.parent / "export" / "model.card.json").read_text())
    assert card["input"]["shape"] == ["batch", 3, 32, 32] and card["input"]["resize"].startswith("shorter side")
    assert card["evaluation"]["split"] == "val" and card["class_names"] == ["cat", "dog", "fish cake"]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda root: None, "does not exist"),
        (lambda root: write_image_folder(root, classes=("cat",), per_class=2), "only the class"),
    ],
    ids=["missing-folder", "one-class"],
)
def test_a_bad_image_dir_is_one_line_and_leaves_nothing(tmp_path, make, message):
    make(tmp_path / "photos")
    result = run_cli(*images_args(tmp_path / "photos"), cwd=tmp_path, check=False)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: data.image_dir=") and message in lines[0], result.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "data").exists()


@pytest.mark.slow  # a ResNet-18 epoch
def test_torchvisions_pretrained_weights_train_the_head_alone_first(tmp_path):
    photos = write_image_folder(tmp_path / "photos", per_class=8)
    torch.manual_seed(0)
    reference = torchvision.models.resnet18()
    torch.save(reference.state_dict(), tmp_path / "resnet18.pt")
    args = images_args(
        photos,
        "--model.backbone=classifier_engine.TorchvisionNet",
        "--model.backbone.weights=null",
        f"--model.backbone.weights_path={tmp_path / 'resnet18.pt'}",
        "--data.image_size=32",
        "--trainer.max_epochs=1",
    )
    run_cli(*args, cwd=tmp_path)
    (last,) = tmp_path.glob("runs/images/*/checkpoints/last.ckpt")
    state = torch.load(last, weights_only=False)["state_dict"]
    assert torch.equal(state["backbone.network.conv1.weight"], reference.conv1.weight)  # frozen in epoch 0
    assert state["backbone.network.fc.weight"].shape == (3, 512)


def test_class_weights_balanced_or_given_by_name_weigh_the_loss():
    weights = loss_weights("balanced", ["a", "b"], [10, 30], "multiclass", 40)
    assert torch.allclose(weights, torch.tensor([2.0, 2 / 3]))
    for spelled in ({"class_weights": "balanced"}, {"balanced_loss": True}):  # the 1.0 name still means the same
        model = ImageClassifier(num_classes=2, class_counts=[10, 30], backbone=partial(FastCNN, width=4), **spelled)
        assert torch.equal(model.criterion.weight, weights)
    assert loss_weights(None, ["a", "b"], [10, 30], "multiclass", 40) is None
    given = loss_weights({"b": 3.0}, ["a", "b"], None, "multiclass", None)
    assert torch.equal(given, torch.tensor([1.0, 3.0]))
    # Multi-label: negatives over positives of each class, as BCE's pos_weight.
    assert torch.allclose(loss_weights("balanced", ["a", "b"], [10, 30], "multilabel", 40), torch.tensor([3.0, 1 / 3]))
    with pytest.raises(ValueError, match=r"needs the training images of every class"):
        loss_weights("balanced", ["a", "b"], None, "multiclass", None)
    with pytest.raises(ValueError, match=r"names zebra, which are not classes of this data"):
        loss_weights({"zebra": 2.0}, ["a", "b"], [1, 1], "multiclass", 2)


def test_strongly_imbalanced_classes_are_named_after_packing(tmp_path, caplog):
    write_image_folder(tmp_path / "photos", classes=("common",), per_class=30)
    write_image_folder(tmp_path / "photos", classes=("rare",), per_class=2)
    data = ImageFolderDataModule(
        image_dir=str(tmp_path / "photos"), image_size=16, cache_dir=str(tmp_path / "packed"), pack_workers=1
    )
    assert data.class_counts == [30, 2]
    with caplog.at_level(logging.INFO):
        data.prepare_data()
    assert "strongly imbalanced (30 training images in the largest, 2 in the smallest)" in caplog.text
    assert "model.class_weights: balanced weighs each class equally" in caplog.text
