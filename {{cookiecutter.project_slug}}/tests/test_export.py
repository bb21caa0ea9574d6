"""``python export.py`` on a real checkpoint: ONNX parity with onnxruntime, the model card, failures."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from functools import partial

import onnx
import onnxruntime
import pytest
import torch
from torch import nn

from {{ cookiecutter.import_name }}.export import onnx_export
from {{ cookiecutter.import_name }}.model_cost import model_cost, thop_macs_and_params, torch_flops
from {{ cookiecutter.import_name }}.models import ImageClassifier
from {{ cookiecutter.import_name }}.models.backbones import AirBench, CifarResNet, FastCNN

from .conftest import FAST_ARGS, PROJECT_ROOT, default_config, run_cli, write_tiny_archive

sys.path.insert(0, str(PROJECT_ROOT))
import export


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A briefly trained tiny model's checkpoint, written by ``main.py fit``."""
    root = tmp_path_factory.mktemp("export")
    write_tiny_archive(root / "data")
    run_cli("fit", "--config", str(default_config()), *FAST_ARGS, f"--data.data_dir={root / 'data'}", cwd=root)
    (path,) = root.glob("runs/*/*/checkpoints/last.ckpt")
    return path


def test_export_command_writes_a_verified_model_and_card(checkpoint, tmp_path):
    output = tmp_path / "deploy" / "classifier.onnx"
    result = subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "export.py"), "--ckpt_path", str(checkpoint), "--output", str(output)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in output.parent.iterdir()) == [
        "classifier.card.json",
        "classifier.card.md",
        "classifier.onnx",
    ]

    graph = onnx.load(str(output))
    (graph_input,) = graph.graph.input
    assert graph_input.type.tensor_type.elem_type == onnx.TensorProto.UINT8
    assert graph_input.type.tensor_type.shape.dim[0].dim_param  # a named, dynamic batch dimension

    model = ImageClassifier.load_from_checkpoint(checkpoint).eval()
    session = onnxruntime.InferenceSession(str(output), providers=["CPUExecutionProvider"])
    for batch in (3, 16):
        images = onnx_export.sample_images(batch, seed=42)
        (logits,) = session.run(None, {"images": images.numpy()})
        with torch.no_grad():
            expected = model(images).numpy()
        assert logits.shape == expected.shape and abs(logits - expected).max() <= 1e-4

    card = json.loads((output.parent / "classifier.card.json").read_text())
    stored = torch.load(checkpoint, weights_only=True)
    assert card["input"]["dtype"] == "uint8" and card["input"]["shape"] == ["batch", 3, 32, 32]
    assert card["class_names"] == model.class_names and card["input"]["mean"] == list(model.hparams.mean)
    assert (
        card["source"]["config_hash"]
        == stored["config_hash"]
        == (checkpoint.parents[1] / "config_hash.txt").read_text().strip()
    )
    assert card["source"]["config_hash"].startswith(checkpoint.parents[1].name)
    assert (card["source"]["epoch"], card["source"]["global_step"]) == (stored["epoch"], stored["global_step"])
    assert card["cost"]["params"] == sum(p.numel() for p in model.parameters())
    assert card["parity"]["batch_sizes"] == [1, 7] and card["parity"]["max_abs_logit_diff"] <= 1e-4
    assert card["parity"]["argmax_equal"] is True
    assert "config hash" in (output.parent / "classifier.card.md").read_text()


def test_failed_parity_exits_nonzero_says_by_how_much_and_leaves_no_file(checkpoint, tmp_path, capsys):
    output = tmp_path / "strict.onnx"
    assert export.main(["--ckpt_path", str(checkpoint), "--output", str(output), "--tolerance", "1e-12"]) == 1
    assert "max |logit diff|" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("problem", ["missing", "truncated", "foreign"])
def test_bad_checkpoints_are_refused_clearly(checkpoint, tmp_path, capsys, problem):
    bad = tmp_path / "bad.ckpt"
    if problem == "truncated":
        bad.write_bytes(checkpoint.read_bytes()[:1000])
    elif problem == "foreign":
        torch.save({"weights": torch.zeros(3)}, bad)
    assert export.main(["--ckpt_path", str(bad), "--output", str(tmp_path / "out" / "m.onnx")]) == 2
    message = capsys.readouterr().err
    assert message.startswith("error: ") and str(bad) in message
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_unwritable_output_is_refused(checkpoint, tmp_path, capsys):
    not_a_folder = tmp_path / "notes.txt"
    not_a_folder.write_text("a file where the output folder should be")
    assert export.main(["--ckpt_path", str(checkpoint), "--output", str(not_a_folder / "m.onnx")]) == 2
    assert f"cannot write to {not_a_folder}" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_an_exporter_failure_is_reported_and_leaves_nothing(checkpoint, tmp_path, capsys, monkeypatch):
    def unsupported(model, args, path, **kwargs):
        with open(path, "wb") as partial:
            partial.write(b"half a graph")
        raise RuntimeError("unsupported operator aten::frobnicate")

    monkeypatch.setattr(torch.onnx, "export", unsupported)
    assert export.main(["--ckpt_path", str(checkpoint), "--output", str(tmp_path / "m.onnx")]) == 2
    assert "aten::frobnicate" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


EVERY_BACKBONE = {
    "fastcnn": partial(FastCNN, width=16),
    "airbench": partial(AirBench, width=16),
    **{f"resnet{depth}": partial(CifarResNet, depth=depth) for depth in (18, 34, 50)},
}


@pytest.mark.parametrize("backbone", EVERY_BACKBONE.values(), ids=EVERY_BACKBONE.keys())
def test_thop_agrees_with_the_torch_flop_counter_and_leaves_the_model_alone(backbone):
    # airbench's whitening and identity-initialized layers are Conv2d subclasses that thop must count too.
    model = ImageClassifier(num_classes=10, backbone=backbone)
    keys = set(model.state_dict())
    macs, params = thop_macs_and_params(model.network())
    flops = torch_flops(model.network())
    assert params == sum(p.numel() for p in model.parameters())
    # thop also counts BatchNorm, activations and pooling; convolutions and matmuls dominate.
    assert flops / 2 <= macs <= 1.05 * flops / 2
    assert set(model.state_dict()) == keys  # no total_ops/total_params buffers left behind
    assert not any(hasattr(m, "total_ops") for m in model.modules())
    assert model_cost(model.network()).macs_per_image == macs


def test_thop_would_pollute_a_model_it_profiles_directly():
    """Why model_cost.py profiles a copy: thop leaves counting buffers on the modules it visits."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import thop
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Identity())  # Identity: a module thop has no rule for
    thop.profile(model, inputs=(torch.zeros(1, 3, 8, 8),), verbose=False)
    assert any(key.endswith("total_ops") for key in model.state_dict())
