"""The TensorRT path: the engine script's commands (anywhere), and a real engine where TensorRT and a GPU exist."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from functools import partial
from pathlib import Path

import pytest
import torch
from cifar_classifier.models import ImageClassifier
from cifar_classifier.models.backbones import FastCNN

from classifier_engine.export.contract import INPUT_NAME, OUTPUT_NAME, sample_images
from classifier_engine.export.onnx_export import export_onnx

from .conftest import PROJECT_ROOT

SCRIPT = PROJECT_ROOT / "scripts" / "tensorrt_engine.sh"


def stand_in_trtexec(folder: Path) -> Path:
    """A ``trtexec`` that records its arguments and writes the engine file it was asked for."""
    folder.mkdir()
    log = folder / "calls.txt"
    tool = folder / "trtexec"
    tool.write_text(
        "#!/usr/bin/env bash\n"
        f'printf "%s\\n" "$*" >> {shlex.quote(str(log))}\n'
        'for arg in "$@"; do [[ $arg == --saveEngine=* ]] && echo engine > "${arg#--saveEngine=}"; done\n'
        "exit 0\n"
    )
    tool.chmod(0o755)
    return log


@pytest.mark.parametrize("size", [32, 96])
def test_engine_script_builds_fp16_and_int8_engines_with_the_exported_input_name(tmp_path, size):
    exported = tmp_path / "export"
    exported.mkdir()
    (exported / "model.card.json").write_text(json.dumps({"input": {"shape": ["batch", 3, size, size]}}))
    (exported / "model.onnx").write_bytes(b"fp32")
    (exported / "model.int8.onnx").write_bytes(b"int8")
    log = stand_in_trtexec(tmp_path / "bin")
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(["bash", str(SCRIPT), str(exported), "1024"], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    fp16, int8 = log.read_text().splitlines()
    shapes = " ".join(
        f"--{kind}Shapes={INPUT_NAME}:{batch}x3x{size}x{size}"
        for kind, batch in (("min", 1), ("opt", 256), ("max", 1024))
    )
    assert fp16 == f"--onnx={exported}/model.onnx --saveEngine={exported}/model.fp16.plan --fp16 {shapes}"
    assert int8 == f"--onnx={exported}/model.int8.onnx --saveEngine={exported}/model.int8.plan --int8 --fp16 {shapes}"
    assert sorted(p.name for p in exported.iterdir()) == [
        "model.card.json", "model.fp16.plan", "model.int8.onnx", "model.int8.plan", "model.onnx",
    ]  # fmt: skip


def test_engine_script_without_trtexec_says_so_in_one_line(tmp_path):
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    result = subprocess.run(["bash", str(SCRIPT), str(tmp_path)], capture_output=True, text=True, env=env)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: trtexec is not on PATH")


@pytest.mark.gpu
def test_a_tensorrt_engine_built_from_the_export_reproduces_pytorch(tmp_path):
    trt = pytest.importorskip("tensorrt", reason="TensorRT's Python package is not installed")
    model = ImageClassifier(num_classes=10, backbone=partial(FastCNN, width=16)).eval()
    onnx_path = tmp_path / "model.onnx"
    export_onnx(model, onnx_path)

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    assert parser.parse(onnx_path.read_bytes()), [parser.get_error(i) for i in range(parser.num_errors)]
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    profile.set_shape(INPUT_NAME, (1, 3, 32, 32), (64, 3, 32, 32), (256, 3, 32, 32))
    config.add_optimization_profile(profile)
    engine = trt.Runtime(logger).deserialize_cuda_engine(builder.build_serialized_network(network, config))
    context = engine.create_execution_context()

    images = sample_images(7)
    expected = model(images).detach()
    device_images = images.cuda()
    logits = torch.empty(7, 10, device="cuda")
    context.set_input_shape(INPUT_NAME, tuple(device_images.shape))
    context.set_tensor_address(INPUT_NAME, device_images.data_ptr())
    context.set_tensor_address(OUTPUT_NAME, logits.data_ptr())
    assert context.execute_async_v3(torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    assert torch.allclose(logits.cpu(), expected, atol=1e-3)
    assert torch.equal(logits.cpu().argmax(1), expected.argmax(1))
