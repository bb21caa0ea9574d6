"""timm networks from their pretrained weights, prepared as the weights expect, through the CLI a user types.

No download: the weights files are saved here from randomly initialised timm networks, and the
Hugging Face cache is an empty folder with ``HF_HUB_OFFLINE=1``, as on a machine without network.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import huggingface_hub
import numpy as np
import pytest
import timm
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from {{ cookiecutter.import_name }}.data.image_files import centre_crop, decode_image
from {{ cookiecutter.import_name }}.models import ImageClassifier
from {{ cookiecutter.import_name }}.models.backbones import TimmNet

from .conftest import PROJECT_ROOT, cli_env, images_args, run_cli, write_image_folder

TIMM_NET = "{{ cookiecutter.import_name }}.models.backbones.TimmNet"


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """An empty Hugging Face cache that may not download: the environment of a machine without network.

    Returned for the CLI's subprocesses; in this process, huggingface_hub read its environment when
    it was imported, so its settings are set too.
    """
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    return env


def saved_weights(name: str, path: Path) -> Path:
    torch.manual_seed(0)
    torch.save(timm.create_model(name).state_dict(), path)
    return path


def test_a_weights_file_loads_through_timm_and_the_head_is_new(tmp_path, offline):
    weights = saved_weights("resnet18", tmp_path / "resnet18.pth")
    network = TimmNet(5, name="resnet18.a1_in1k", weights_path=str(weights))
    reference = torch.load(weights, weights_only=True)
    assert torch.equal(network.network.conv1.weight, reference["conv1.weight"])
    assert network.head().out_features == 5 and network(torch.zeros(2, 3, 32, 32)).shape == (2, 5)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"name": "resnet5"}, "is not a timm model; the closest it knows: resnet50"),
        ({"name": "resnet50.no_such_tag"}, "has no pretrained weights in timm; choose a name with weights"),
        ({"name": "resnet18.a1_in1k"}, "are not in the Hugging Face cache and could not be downloaded"),
    ],
    ids=["unknown-name", "no-weights", "offline-and-not-cached"],
)
def test_each_timm_mistake_is_one_line(settings, message, offline):
    with pytest.raises(ValueError, match=message):
        TimmNet(3, **settings)


def test_a_weights_file_of_another_network_names_the_keys_that_differ(tmp_path, offline):
    other = saved_weights("resnet34", tmp_path / "resnet34.pth")
    with pytest.raises(ValueError, match=r"are not weights of timm's resnet18.a1_in1k \(unexpected \['layer1.2"):
        TimmNet(3, name="resnet18.a1_in1k", weights_path=str(other))


def test_the_weights_decide_how_images_are_prepared():
    lite = TimmNet.expected_input({"name": "tf_efficientnet_lite0"})
    assert lite == {"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5), "interpolation": "bicubic", "crop_pct": 0.875}
    assert TimmNet.expected_input({"name": "resnet50.a1_in1k"})["crop_pct"] == 0.95
    assert TimmNet.expected_input({"name": "resnet50", "pretrained": False}) is None  # nothing to match


@pytest.mark.slow  # a fit, two predicts and an export of an EfficientNet-Lite
def test_a_timm_network_is_trained_predicted_and_exported_as_its_weights_expect(tmp_path, offline):
    photos = write_image_folder(tmp_path / "photos", per_class=12)
    weights = saved_weights("tf_efficientnet_lite0", tmp_path / "lite0.pth")
    net = [f"--model.backbone={TIMM_NET}", "--model.backbone.name=tf_efficientnet_lite0"]
    args = images_args(photos, *net, f"--model.backbone.weights_path={weights}", "--data.image_size=48")
    run_cli(*args, "--data.test_fraction=0.25", "--trainer.max_epochs=1", cwd=tmp_path, env=offline)
    (run,) = tmp_path.glob("runs/images/*/checkpoints/last.ckpt")
    run_dir = run.parents[1]

    # Packed at the weights' interpolation and evaluation crop; normalized with their mean and std (0.5, not
    # ImageNet's).
    (packed,) = (p for p in (tmp_path / "data" / "packed").iterdir() if p.is_dir())
    meta = json.loads((packed / "meta.json").read_text())
    assert (meta["interpolation"], meta["crop_pct"]) == ("bicubic", 0.875)
    model = ImageClassifier.load_from_checkpoint(run, map_location="cpu").eval()
    assert tuple(model.hparams.mean) == tuple(model.hparams.std) == (0.5, 0.5, 0.5)

    # predict on the files themselves gives what predict on the packed split gives, image for image:
    # the same decoding and the same normalization as in training.
    predict = ["predict", "--config", str(run_dir / "config.yaml"), "--ckpt_path=last"]
    run_cli(*predict, cwd=tmp_path, env=offline)
    run_cli(*predict, f"--data.predict_dir={photos}", cwd=tmp_path, env=offline)
    tables = [
        {row["image"]: row["top5"] for row in csv.DictReader(path.read_text().splitlines())}
        for path in sorted(run_dir.glob("predict/*/predictions.csv"), key=lambda p: p.stat().st_mtime)
    ]
    split, files = tables
    assert split and all(files[image] == top5 for image, top5 in split.items())
    key = next(iter(split))
    decoded = decode_image(photos / key, 48, "crop", "bicubic", 0.875).transpose(2, 0, 1)
    rows = np.load(packed / "train_images.npy")
    assert rows.shape[-2:] == (55, 55)  # packed at 48 / 0.875: the margin the evaluation crop leaves out
    assert any(np.array_equal(decoded, centre_crop(row, 48)) for row in rows)  # packing's own pixels, served

    exported = subprocess.run(
        # A barely trained network from random weights has large logits: fp32 ONNX differs from PyTorch by ~1e-2.
        [sys.executable, str(PROJECT_ROOT / "export.py"), f"--ckpt_path={run}", "--formats=onnx", "--tolerance=0.05"],
        cwd=tmp_path, capture_output=True, text=True, env=cli_env(**offline), timeout=600,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr[-3000:]
    card = json.loads((run.parent / "export" / "model.card.json").read_text())
    assert card["input"]["mean"] == [0.5, 0.5, 0.5] and "bicubic" in card["input"]["resize"]
    assert "0.875" in card["input"]["resize"]


@pytest.mark.slow  # two epochs of a ResNet-18 at 32 px, a test and an export
@pytest.mark.every_render
def test_the_finetune_preset_trains_the_head_then_everything_from_a_weights_file(tmp_path, offline):
    photos = write_image_folder(tmp_path / "photos", per_class=8)
    weights = saved_weights("resnet18", tmp_path / "resnet18.pth")
    preset = ["--config", str(PROJECT_ROOT / "configs" / "presets" / "finetune.yaml")]
    net = ["--model.backbone.name=resnet18.a1_in1k", f"--model.backbone.weights_path={weights}"]
    tiny = ["--data.image_size=32", "--data.batch_size=8", "--trainer.max_epochs=2"]
    result = run_cli(*images_args(photos, *preset, *net, *tiny), cwd=tmp_path, env=offline)
    output = result.stdout + result.stderr
    assert "the head trains" in output and "all layers train" in output
    (run,) = tmp_path.glob("runs/images/*/checkpoints/last.ckpt")
    checkpoint = torch.load(run, weights_only=True)
    hparams = checkpoint["hyper_parameters"]
    assert hparams["backbone"]["init_args"]["name"] == "resnet18.a1_in1k"
    assert tuple(hparams["mean"]) == (0.485, 0.456, 0.406)  # what the a1 weights were trained with

    # The pretrained body learned at a tenth of the head's rate; the MixUp batches counted in train/top1.
    events = EventAccumulator(str(run.parents[1]), size_guidance={"scalars": 0})
    events.Reload()
    head, body = ([e.value for e in events.Scalars(f"train/lr/{part}")] for part in ("head", "body"))
    assert len(head) == len(body) > 1 and body == pytest.approx([0.1 * lr for lr in head])
    assert 0 <= events.Scalars("train/top1")[-1].value <= 1

    # The checkpoint's weights are the moving average; the training weights are kept beside them.
    averaged, trained = checkpoint["state_dict"], checkpoint["current_model_state"]
    assert not torch.equal(averaged["backbone.network.fc.weight"], trained["backbone.network.fc.weight"])
    tested = run_cli("test", "--config", str(run.parents[1] / "config.yaml"), "--ckpt_path=last", cwd=tmp_path,
                     env=offline)  # fmt: skip
    assert "WeightAveraging" not in tested.stdout + tested.stderr  # nothing to restore outside fit, nothing said
    (report,) = run.parents[1].glob("test/*/report.html")  # the report of a timm network: overlays where it errs
    assert "no overlays" not in report.read_text() and "Per class" in report.read_text()
    model = ImageClassifier.load_from_checkpoint(run, map_location="cpu")
    assert torch.equal(model.state_dict()["backbone.network.fc.weight"], averaged["backbone.network.fc.weight"])
    exported = subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "export.py"), f"--ckpt_path={run}", "--formats=onnx", "--tolerance=0.05"],
        cwd=tmp_path, capture_output=True, text=True, env=cli_env(**offline), timeout=600,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr[-3000:]
    card = (run.parent / "export" / "model.card.md").read_text()
    assert "- Weights: the moving average of the training weights over 4 updates (EMAWeights)" in card
