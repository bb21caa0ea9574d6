"""``test`` writes report.html, per_class.csv and mistakes.csv: checked through the CLI, and the overlays' layers."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from cifar_classifier.models.backbones import FastCNN
from photo_classifier.models.backbones import TimmNet
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from classifier_engine import TorchvisionNet
from classifier_engine.models.class_activation import activation_layer, class_activation_maps

from .conftest import images_args, run_cli, write_image_folder

CLASSES = ("cat", "dog", "fish cake")


def photos_with_a_mislabelled_test_folder(root: Path) -> Path:
    """train/ and val/ as they should be; test/ with each class's folder holding another class's photos."""
    photos = root / "photos"
    write_image_folder(photos / "train", CLASSES, per_class=16)
    write_image_folder(photos / "val", CLASSES, per_class=4)
    write_image_folder(photos / "test", ("dog", "fish cake", "cat"), per_class=4)  # every test label is wrong
    return photos


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run on the photos, and its folder."""
    root = tmp_path_factory.mktemp("report")
    photos = photos_with_a_mislabelled_test_folder(root)
    run_cli(*images_args(photos, "--trainer.max_epochs=6", "--model.backbone.width=8"), cwd=root)
    (run_dir,) = {path.parents[1] for path in root.glob("runs/images/*/checkpoints/last.ckpt")}
    return root, photos, run_dir


@pytest.mark.slow  # a fit and two tests
@pytest.mark.every_render
def test_test_writes_a_report_of_every_class_and_the_most_confident_mistakes_with_overlays(trained):
    root, photos, run_dir = trained
    tested = run_cli("test", "--config", str(run_dir / "config.yaml"), "--ckpt_path=last", cwd=root)
    (report,) = run_dir.glob("test/*/report.html")
    assert tested.stdout.strip().splitlines()[-1] == f"Report: {report.relative_to(root)}"  # the closing line
    page = report.read_text()
    for name in CLASSES:
        assert f'<td class="text">{name}</td>' in page  # a per-class row (and a confusion-matrix row)
    mistakes = list(csv.DictReader((report.parent / "mistakes.csv").read_text().splitlines()))
    assert 6 <= len(mistakes) <= 12 and all(row["true"] != row["predicted"] for row in mistakes)  # test/ is mislabelled
    assert page.count("<figure>") == len(mistakes)  # every mistake (up to 24), most confident first
    # Each mistake as seen and with its overlay, embedded; four charts: reliability before and after temperature
    # scaling, accuracy against coverage, the test images against the "unlike the training images" threshold; and
    # the 12 test images least like the training ones, least first.
    assert page.count('src="data:image/png;base64,') == 2 * len(mistakes) + 4 + 12
    charts = ("uncalibrated reliability", "calibrated reliability", "accuracy against coverage",
              "share of test images against the score")  # fmt: skip
    assert all(f'alt="{chart}"' in page for chart in charts)
    unusual = re.findall(r'<span class="unusual">.*?score (-?[0-9.e-]+)', page)
    assert len(unusual) == 12 and [float(s) for s in unusual] == sorted(float(s) for s in unusual)
    assert not re.search(r'src="(?!data:)', page)  # nothing the page would fetch
    assert [float(row["p_predicted"]) for row in mistakes] == sorted((float(r["p_predicted"]) for r in mistakes),
                                                                      reverse=True)  # fmt: skip
    for row in mistakes:  # the user's own files
        assert (Path(row["image"]) if Path(row["image"]).is_absolute() else root / row["image"]).is_file()
        assert row["image"].startswith(str(photos / "test")) and row["image"] in page
    per_class = list(csv.DictReader((report.parent / "per_class.csv").read_text().splitlines()))
    assert [row["class"] for row in per_class] == list(CLASSES)
    assert sum(int(row["support"]) for row in per_class) == 12
    events = EventAccumulator(str(report.parent), size_guidance={"images": 0, "tensors": 0})
    events.Reload()
    assert "test/confident_mistakes" in events.Tags()["images"]
    assert any("test/per_class" in tag for tag in events.Tags()["tensors"])


@pytest.mark.slow  # a test that fails half way
@pytest.mark.every_render
def test_a_failed_evaluation_leaves_no_report(trained):
    root, _photos, run_dir = trained
    before = set(run_dir.glob("test/*/*"))
    result = run_cli("test", "--config", str(run_dir / "config.yaml"), "--ckpt_path=last",
                     "--trainer.callbacks+=engine_probes.FailInTest", cwd=root, check=False,
                     env={"FAIL_TEST_AT": "1"})  # fmt: skip
    assert result.returncode != 0 and "error:" in result.stderr
    written = {path.name for path in set(run_dir.glob("test/*/*")) - before}
    assert not written & {"report.html", "per_class.csv", "mistakes.csv"}
    assert not [path for path in run_dir.rglob("*") if ".partial" in path.name or path.name.startswith(".")]


@pytest.mark.parametrize(
    ("network", "layer"),
    [
        (lambda: FastCNN(3, width=4), "5"),
        (lambda: TorchvisionNet(3, "resnet18"), "layer4"),
        (lambda: TorchvisionNet(3, "vit_b_16"), None),
        # timm's random heads: a zero head (the fine-tune's start) points nowhere until it has trained
        (lambda: TimmNet(3, "resnet10t", pretrained=False, head_init="timm"), "layer4"),
        (lambda: TimmNet(3, "efficientnet_b0", pretrained=False, head_init="timm"), "blocks.6"),
    ],
    ids=["FastCNN", "torchvision-resnet18", "torchvision-vit", "timm-resnet10t", "timm-efficientnet_b0"],
)
def test_the_overlay_reads_the_last_convolutional_stage(network, layer):
    torch.manual_seed(1)  # a random network: one whose chosen classes' maps are positive somewhere
    backbone = network().eval()
    found, name = activation_layer(backbone, 224 if layer is None else 64)
    if layer is None:  # a transformer: tokens, not a map
        assert found is None and "tokens" in name
        return
    assert found is not None and name == layer
    images = np.random.default_rng(0).integers(0, 256, (2, 3, 64, 64), dtype=np.uint8)
    with torch.no_grad():
        chosen = backbone(torch.from_numpy(images).float()).argmax(dim=1).numpy()  # the classes it would answer
    maps = class_activation_maps(torch.nn.Sequential(backbone), found, images, chosen)
    peaks = maps.max(axis=(1, 2))
    assert maps.shape == (2, 64, 64) and maps.min() >= 0 and peaks.max() == pytest.approx(1)
    assert all(peak == pytest.approx(1) or peak == 0 for peak in peaks)  # scaled to 1, or nowhere positive


def test_a_transformer_gets_no_overlay_and_says_why():
    found, reason = activation_layer(TimmNet(3, "vit_tiny_patch16_224", pretrained=False).eval(), 224)
    assert found is None and "tokens" in reason


def test_a_report_without_mistakes_says_so_under_a_plain_title():
    from classifier_engine.callbacks.evaluation_report import report_page
    from classifier_engine.callbacks.report_tables import confusion_counts, per_class

    labels = np.array([0, 1, 1])
    confusion = confusion_counts(labels, labels, 2)
    page = report_page({"images": 3}, per_class(confusion, ["ant", "bee"]), confusion, ["ant", "bee"],
                       np.array([], dtype=int), labels, labels, np.eye(2)[labels], ["a", "b", "c"], [], "")  # fmt: skip
    assert "No mistakes." in page and ">Mistakes<" in page and "0 most confident" not in page
