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
import yaml
from photo_classifier.models import ImageClassifier
from photo_classifier.models.backbones import TimmNet
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from classifier_engine.data.image_files import centre_crop, decode_image
from classifier_engine.foundation.errors import UsageError

from .conftest import (
    PHOTO_ROOT,
    PROJECT_ROOT,
    cli_env,
    finetune_args,
    free_port,
    images_args,
    run_cli,
    write_image_folder,
)

TIMM_NET = "photo_classifier.models.backbones.TimmNet"  # the photo render's own: its export trusts it


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
    with pytest.raises((ValueError, UsageError), match=message):
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
        [sys.executable, str(PHOTO_ROOT / "export.py"), f"--ckpt_path={run}", "--formats=onnx", "--tolerance=0.05"],
        cwd=tmp_path, capture_output=True, text=True, env=cli_env(**offline), timeout=600,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr[-3000:]
    card = json.loads((run.parent / "export" / "model.card.json").read_text())
    assert card["input"]["mean"] == [0.5, 0.5, 0.5] and "bicubic" in card["input"]["resize"]
    assert "0.875" in card["input"]["resize"]


def default_weights(path: Path) -> Path:
    """A weights file of the default config's network (random weights: the route is tested, not the accuracy)."""
    name = yaml.safe_load((PHOTO_ROOT / "configs" / "images.yaml").read_text())["model"]["backbone"]["init_args"]
    return saved_weights(name["name"].split(".")[0], path)


def plan_line(output: str) -> str:
    (line,) = [line for line in output.splitlines() if "Fine-tuning " in line or "from scratch:" in line]
    return line


def test_a_new_head_starts_at_zero_unless_asked_for_timms_own(tmp_path, offline):
    weights = saved_weights("resnet18", tmp_path / "resnet18.pth")
    zero = TimmNet(4, name="resnet18.a1_in1k", weights_path=str(weights))
    assert not zero.head().weight.any() and not zero.head().bias.any()
    assert torch.equal(zero(torch.rand(2, 3, 32, 32)), torch.zeros(2, 4))  # every class equally likely
    assert TimmNet(4, name="resnet18.a1_in1k", weights_path=str(weights), head_init="timm").head().weight.any()
    with pytest.raises(ValueError, match=r"model\.backbone\.head_init must be zero or timm, got 'small'"):
        TimmNet(4, name="resnet18.a1_in1k", weights_path=str(weights), head_init="small")


@pytest.mark.slow  # a fit of the default network at 32 px
def test_the_default_fine_tune_fits_the_folder_and_says_so_in_one_line(tmp_path, offline):
    photos = write_image_folder(tmp_path / "photos", per_class=12)  # 27 training images of 3 classes
    weights = default_weights(tmp_path / "default.pth")
    result = run_cli(*finetune_args(photos, weights), cwd=tmp_path, env=offline)
    line = plan_line(result.stdout + result.stderr)
    assert line.endswith(
        "Fine-tuning 27 training images: 2 epochs of 1 step, batch 16 (1 step an epoch), no MixUp below 20,000 "
        "images, head alone for 1 epoch, the head first fitted as a linear probe (LP-FT), BatchNorm statistics kept "
        "as pretrained (batches of a few photos would re-estimate them badly), the better of probe and fine-tune "
        "kept, the weights averaged over about the last 1 of 2 steps"
    )
    (run_dir,) = {path.parents[1] for path in tmp_path.glob("runs/images/*/checkpoints/last.ckpt")}
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())["data"]["init_args"]
    assert saved["batch_size"] is None and saved["mixup_alpha"] is None  # the config as given: the rule decides
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    assert [event.step for event in events.Scalars("train/lr/head")] == [0, 1]  # one batch of 16 an epoch


@pytest.mark.slow  # three short fits of the default network at 32 px
def test_each_automatic_choice_gives_way_to_a_value_the_config_sets(tmp_path, offline):
    photos = write_image_folder(tmp_path / "photos", per_class=12)
    weights = default_weights(tmp_path / "default.pth")
    config = yaml.safe_load((PHOTO_ROOT / "configs" / "images.yaml").read_text())
    config["data"]["init_args"].update(batch_size=8, mixup_alpha=0.2)
    (freeze,) = [item for item in config["trainer"]["callbacks"] if item["class_path"].endswith(".FreezeBackbone")]
    freeze["init_args"]["unfreeze_at_epoch"] = 0
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(config))
    args = finetune_args(photos, weights)
    args[args.index(str(PHOTO_ROOT / "configs" / "images.yaml"))] = str(tmp_path / "mine.yaml")
    result = run_cli(*args, cwd=tmp_path, env=offline)
    line = plan_line(result.stdout + result.stderr)
    assert "batch 8 (as set; 3 steps an epoch), MixUp 0.2 (as set), all layers at once (as set)" in line

    # A step budget instead of epochs: the epochs follow from the steps an epoch has.
    budget = run_cli(*finetune_args(photos, weights, "--trainer.max_epochs=-1", "--trainer.max_steps=3"),
                     cwd=tmp_path, env=offline)  # fmt: skip
    assert "Fine-tuning 27 training images: 3 steps (3 epochs of 1), batch 16" in plan_line(
        budget.stdout + budget.stderr
    )

    # From scratch, nothing pretrained is kept: no head-first epoch, and the line says so.
    scratch = ["--config", str(PHOTO_ROOT / "configs" / "presets" / "from_scratch.yaml"), "--data.image_size=32"]
    args = [*finetune_args(photos, weights)[:3], *scratch, f"--data.image_dir={photos}", "--data.val_fraction=0.25",
            "--data.num_workers=0", "--trainer.max_epochs=1", "--model.backbone.width=4"]  # fmt: skip
    result = run_cli(*args, cwd=tmp_path, env=offline)
    line = plan_line(result.stdout + result.stderr)
    # (a batch of 256 is more than the folder holds: fitted to the 27 images)
    assert line.startswith("Training 27 training images from scratch: 1 epoch of 1 step, batch 27 (as set; 1 step an")
    assert "all layers at once" in line


@pytest.mark.parametrize("hub", ["offline", pytest.param("unreachable", marks=pytest.mark.slow)])
def test_the_default_photo_config_without_weights_is_refused_in_one_line(tmp_path, offline, hub):
    photos = write_image_folder(tmp_path / "photos", per_class=4)
    before = sorted(path.name for path in tmp_path.iterdir())
    if hub == "unreachable":  # no HF_HUB_OFFLINE, and nothing answers where the hub should be: no retries shown
        offline = {**offline, "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}"}
    result = run_cli("fit", "--config", str(PHOTO_ROOT / "configs" / "images.yaml"), f"--data.image_dir={photos}",
                     cwd=tmp_path, env=offline, check=False, timeout=60)  # fmt: skip
    assert result.returncode == 2
    seed, line = result.stderr.strip().splitlines()  # Lightning's "Seed set to 42", then the one line
    assert seed == "Seed set to 42" and "Traceback" not in result.stdout
    assert line.startswith("error: the pretrained weights of tf_efficientnet_lite1.in1k are not in the Hugging Face")
    assert "--model.backbone.weights_path FILE" in line and line.endswith("--config configs/presets/from_scratch.yaml")
    assert sorted(path.name for path in tmp_path.iterdir()) == before  # no run folder, no packed copy


@pytest.mark.slow  # two epochs of the default network at 32 px, a test and an export
@pytest.mark.every_render
def test_the_default_fine_tune_trains_the_head_then_everything_from_a_weights_file(tmp_path, offline):
    photos = write_image_folder(tmp_path / "photos", per_class=12)
    weights = default_weights(tmp_path / "default.pth")
    result = run_cli(*finetune_args(photos, weights, "--data.batch_size=8"), cwd=tmp_path, env=offline)
    output = result.stdout + result.stderr
    assert "the head trains" in output and "all layers train" in output
    (run,) = tmp_path.glob("runs/images/*/checkpoints/last.ckpt")
    checkpoint = torch.load(run, weights_only=True)
    hparams = checkpoint["hyper_parameters"]
    assert hparams["backbone"]["init_args"]["name"] == "tf_efficientnet_lite1.in1k"
    assert tuple(hparams["mean"]) == (0.5, 0.5, 0.5)  # what the lite weights were trained with

    # The pretrained body learned at a tenth of the head's rate.
    events = EventAccumulator(str(run.parents[1]), size_guidance={"scalars": 0})
    events.Reload()
    head, body = ([e.value for e in events.Scalars(f"train/lr/{part}")] for part in ("head", "body"))
    assert len(head) == len(body) > 1 and body == pytest.approx([0.1 * lr for lr in head])
    assert 0 <= events.Scalars("train/top1")[-1].value <= 1

    # The checkpoint's weights are the moving average; the training weights are kept beside them.
    averaged, trained = checkpoint["state_dict"], checkpoint["current_model_state"]
    assert checkpoint["calibration"]["fitted_on"]  # the calibration fitted on the validation images
    head_key = "backbone.network.classifier.weight"
    assert not torch.equal(averaged[head_key], trained[head_key])
    tested = run_cli("test", "--config", str(run.parents[1] / "config.yaml"), "--ckpt_path=last", cwd=tmp_path,
                     env=offline)  # fmt: skip
    assert "WeightAveraging" not in tested.stdout + tested.stderr  # nothing to restore outside fit, nothing said
    (report,) = run.parents[1].glob("test/*/report.html")  # the report of a timm network: overlays where it errs
    assert "no overlays" not in report.read_text() and "Per class" in report.read_text()
    model = ImageClassifier.load_from_checkpoint(run, map_location="cpu")
    assert torch.equal(model.state_dict()[head_key], averaged[head_key])
    exported = subprocess.run(
        [sys.executable, str(PHOTO_ROOT / "export.py"), f"--ckpt_path={run}", "--formats=onnx", "--tolerance=0.05"],
        cwd=tmp_path, capture_output=True, text=True, env=cli_env(**offline), timeout=600,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr[-3000:]
    card = (run.parent / "export" / "model.card.md").read_text()
    (weights_line,) = [line for line in card.splitlines() if line.startswith("- Weights: ")]
    if "kept over its linear probe" in weights_line:  # else the probe was kept: the starting network and its head
        averaged = "- Weights: the moving average of the training weights over 6 updates (EMAWeights)"
        assert weights_line.startswith(averaged), weights_line
    else:
        assert "the starting network with a head fitted on its frozen features" in weights_line, weights_line


@pytest.mark.slow  # two CPU processes, two epochs of the default network at 32 px: the full tier only
def test_the_default_fine_tune_runs_under_ddp_with_its_body_frozen_for_the_head_epoch(tmp_path, offline):
    # The DDP preset searches for no unused parameters: the frozen body still gets its gradients, dropped before
    # each step, so the reducer sees every parameter and the body stays exactly as loaded for the head's epoch.
    photos = write_image_folder(tmp_path / "photos", per_class=12)
    weights = default_weights(tmp_path / "default.pth")
    ddp = ["--config", str(PROJECT_ROOT / "configs" / "presets" / "ddp.yaml"), "--trainer.devices=2"]
    head_epoch = ["--trainer.max_epochs=1", "--data.batch_size=4"]
    result = run_cli(*finetune_args(photos, weights, *ddp, *head_epoch), cwd=tmp_path, env=offline, timeout=600)
    assert "Fine-tuning 27 training images: 1 epoch of 3 steps, batch 8 (4 per device x 2 devices; as set; 3 steps" in (
        result.stdout + result.stderr
    )
    (last,) = tmp_path.glob("runs/images/*/checkpoints/last.ckpt")
    checkpoint = torch.load(last, weights_only=True)
    trained, loaded = checkpoint["current_model_state"], torch.load(weights, weights_only=True)
    assert checkpoint["global_step"] == 3
    statistics = ("running_mean", "running_var", "num_batches_tracked")  # BatchNorm keeps counting while frozen
    body = [key for key in loaded if not key.startswith("classifier.") and not key.endswith(statistics)]
    assert body and all(torch.equal(trained[f"backbone.network.{key}"], loaded[key]) for key in body)
    assert trained["backbone.network.classifier.weight"].any()  # the head learned
