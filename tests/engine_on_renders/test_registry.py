"""``export.py --register``: versions in MLflow's registry, loaded by MLflow's own client and served over HTTP."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import mlflow
import numpy as np
import onnxruntime
import pytest
from cifar_classifier.models import ImageClassifier

from classifier_engine.commands import export as export_command
from classifier_engine.data.archive import prepare

from .conftest import (
    DATASET,
    PROJECT_ROOT,
    cli_env,
    default_config,
    fit_args,
    free_port,
    run_cli,
    write_tiny_archive,
)
from .test_export import snapshot

pytestmark = [
    # mlflow 3.17's SQL store uses a SQLAlchemy 2.1 loader option that SQLAlchemy deprecates
    pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]
PRESET = PROJECT_ROOT / "configs" / "presets" / "mlflow.yaml"


def export_main(args: list[str]) -> int:
    """``python export.py ARGS`` of the CIFAR render, in this process."""
    return export_command.main(ImageClassifier, "cifar-classifier", args, default_config())


@pytest.fixture(scope="module")
def tracked(tmp_path_factory) -> Path:
    """A one-epoch run tracked by the MLflow preset (runs/mlflow.db beside it); returns its last.ckpt."""
    root = tmp_path_factory.mktemp("registry")
    write_tiny_archive(root / "data")
    run_cli(*fit_args("data", "--config", str(PRESET)), cwd=root)
    (checkpoint,) = root.glob("runs/*/*/checkpoints/last.ckpt")
    return checkpoint


def post(port: int, images: np.ndarray) -> np.ndarray:
    body = json.dumps({"inputs": {"images": images.tolist()}}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/invocations", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return np.asarray(json.loads(response.read())["predictions"]["logits"], dtype=np.float32)


def serve(model_uri: str, tracking_uri: str, port: int, cwd: Path) -> subprocess.Popen:
    """``mlflow models serve`` as docs/shipping.md gives it, ready when /ping answers."""
    bin_dir = Path(sys.executable).parent  # mlflow and the uvicorn it starts
    command = [str(bin_dir / "mlflow"), "models", "serve", "-m", model_uri, "-p", str(port), "--env-manager", "local"]
    env = cli_env(MLFLOW_TRACKING_URI=tracking_uri, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    server = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"mlflow models serve exited {server.returncode}: {server.stderr.read()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2):
                return server
        except OSError:
            time.sleep(0.5)
    server.kill()
    raise AssertionError("mlflow models serve did not answer /ping within 180 s")


@pytest.mark.slow  # mlflow models serve starts a server: the full tier (-m slow); CI registers and loads
# (test_labels' multi-label walk)
def test_registered_versions_load_in_mlflow_and_are_served_over_http(tracked):
    root = tracked.parents[4]
    result = subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "export.py"), "--ckpt_path", str(tracked), "--formats", "onnx,int8",
         "--calibration_images", "64", "--max_int8_drop", "100", "--register", "tiny-cifar", "--alias", "candidate",
         "--config", str(tracked.parents[1] / "config.yaml")],  # the run's config: its MLflow run takes the export's
        cwd=root, capture_output=True, text=True, timeout=600, env=cli_env(),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "registered tiny-cifar version 1 in sqlite:///runs/mlflow.db: models:/tiny-cifar@candidate" in result.stdout
    assert "registered tiny-cifar-int8 version 1" in result.stdout
    folder = tracked.parent / "export"
    card = json.loads((folder / "model.card.json").read_text())

    tracking_uri = f"sqlite:///{root / 'runs' / 'mlflow.db'}"
    mlflow.set_tracking_uri(tracking_uri)
    client = mlflow.MlflowClient()
    version = client.get_model_version_by_alias("tiny-cifar", "candidate")
    # The version's run is the export's, nested in the run that trained the checkpoint.
    (training,) = mlflow.search_runs(
        experiment_names=["cifar-classifier"],
        filter_string=f"attributes.run_name = '{tracked.parents[1].name}'",
        output_format="list",
    )
    export_run = client.get_run(version.run_id)
    assert export_run.data.tags["mlflow.parentRunId"] == training.info.run_id
    assert export_run.data.tags["config_hash"] == card["source"]["config_hash"]
    model = client.get_logged_model(version.source.rpartition("/")[2])
    logged = {metric.key: metric.value for metric in model.metrics}
    assert logged == {
        "export/onnx/top1": card["artifacts"]["onnx"]["accuracy"]["top1"],
        "export/onnx/top5": card["artifacts"]["onnx"]["accuracy"]["top5"],
        "export/pytorch/top1": card["eager"]["top1"],
        "export/pytorch/top5": card["eager"]["top5"],
    }
    files = Path(mlflow.artifacts.download_artifacts(version.source))
    assert json.loads((files / "extra_files" / "model.card.json").read_text()) == card
    assert (files / "extra_files" / "config.yaml").read_bytes() == (tracked.parents[1] / "config.yaml").read_bytes()
    assert client.get_model_version_by_alias("tiny-cifar-int8", "candidate").run_id == version.run_id
    assert version.description.startswith("model.onnx (ONNX, float32) from ") and "top-1 " in version.description

    # MLflow's own client classifies the test split with the card's accuracy.
    test = prepare(root / "data", DATASET, download=False, verify_checksum=False).split("test")
    test_images, test_labels = np.load(test.images), np.load(test.labels)
    loaded = mlflow.pyfunc.load_model("models:/tiny-cifar@candidate")
    logits = loaded.predict({"images": np.ascontiguousarray(test_images)})["logits"]
    assert (logits.argmax(1) == test_labels).sum() == card["artifacts"]["onnx"]["accuracy"]["top1_correct"]
    assert loaded.metadata.get_input_schema().inputs[0].type == np.dtype(np.uint8)

    # The serve command of docs/shipping.md answers a real request with the file's logits.
    port = free_port()
    server = serve("models:/tiny-cifar@candidate", tracking_uri, port, root)
    try:
        answered = post(port, test_images[:4])
    finally:
        server.terminate()
        server.wait(timeout=30)
    session = onnxruntime.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(answered, session.run(None, {"images": test_images[:4]})[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--alias", "candidate"], "--alias names an alias of a registered model; add --register NAME"),
        (["--register", "a/b"], "has no '/' or ':'"),
        (["--register", "pets", "--alias", "latest"], "MLflow keeps 'latest' and 'v<N>' for itself"),
        (["--register", "pets", "--formats", "pt2"], "add onnx or int8 to --formats"),
        (["--register", "pets", "--tracking_uri", "http://127.0.0.1:9"], "cannot reach the model registry"),
    ],
)
def test_a_registration_that_cannot_happen_is_refused_before_any_export(tracked, capsys, options, message):
    before = snapshot(tracked.parents[4])
    with pytest.raises(SystemExit) as exited:
        export_main(["--ckpt_path", str(tracked), *options])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code in (1, 2) and line.startswith("error: ") and message in line
    assert snapshot(tracked.parents[4]) == before


def test_without_mlflow_installed_register_is_one_line(tracked, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # what `import mlflow` meets where it is not installed
    with pytest.raises(SystemExit) as exited:
        export_main(["--ckpt_path", str(tracked), "--register", "pets"])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and line == (
        "error: --register needs mlflow, which is not installed; pip install -e '.[mlflow]'"
    )


def test_a_registry_failing_after_the_export_keeps_the_files_and_says_so(tracked, tmp_path, capsys, monkeypatch):
    def refuse(*args, **kwargs):
        raise mlflow.exceptions.MlflowException("the registry went away")

    # On the module itself: ``mlflow.onnx`` is a lazy stand-in that loads it on first use.
    monkeypatch.setattr(importlib.import_module("mlflow.onnx"), "log_model", refuse)
    output = tmp_path / "shipped"
    with pytest.raises(SystemExit) as exited:
        export_main(["--ckpt_path", str(tracked), "--output_dir", str(output), "--formats", "onnx", "--eval_limit",
                     "16", "--register", "pets", "--tracking_uri", f"sqlite:///{tmp_path / 'mlflow.db'}"])  # fmt: skip
    lines = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 1 and lines[-1].startswith("error: registering in sqlite:///")
    assert "the registry went away" in lines[-1] and f"the exported files are in {output}" in lines[-1]
    assert sorted(p.name for p in output.iterdir()) == ["model.card.json", "model.card.md", "model.onnx"]


def test_a_refused_export_registers_nothing(tracked, tmp_path, capsys):
    store = tmp_path / "mlflow.db"
    with pytest.raises(SystemExit) as exited:  # no float32 file reproduces PyTorch to 1e-12: the parity check refuses
        export_main(["--ckpt_path", str(tracked), "--output_dir", str(tmp_path / "shipped"), "--formats", "onnx",
                     "--tolerance", "1e-12", "--register", "pets", "--tracking_uri", f"sqlite:///{store}"])  # fmt: skip
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 1 and "model.onnx does not reproduce PyTorch" in line
    assert not (tmp_path / "shipped").exists()
    assert mlflow.MlflowClient(f"sqlite:///{store}").search_registered_models() == []
