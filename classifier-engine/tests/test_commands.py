"""Every command on the reference model (classifier_engine.testing.reference), as a project's user types them.

A folder of photo files is packed, trained on, resumed after a scheduler's SIGTERM, tested, predicted on
and exported, with nothing but the library installed: what the engine promises a project holds for the
smallest model that keeps the contract.
"""

from __future__ import annotations

import csv
import json
import signal
from pathlib import Path

import numpy as np
import onnxruntime
import torch
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from classifier_engine.testing.reference import ReferenceClassifier

from .conftest import FIT, only_run_dir, reference, tree, write_image_folder


def scalars(run_dir: Path) -> dict[str, dict[int, float]]:
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def test_a_fit_keeps_the_calibration_and_the_preprocessing_in_its_checkpoint(trained):
    run_dir = only_run_dir(trained)
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["calibration"]["fitted_on"]["images"] == 18  # a quarter of each class, validated on
    assert checkpoint["preprocessing"]["image_size"] == 32
    bank = checkpoint["domain_bank"]  # every training image's features (54: within the bound), fp16
    assert bank.dtype == torch.float16 and bank.shape == (54, 32)
    assert (
        checkpoint["calibration"]["domain"]["score"] == "knn" and checkpoint["calibration"]["domain"]["neighbours"] == 5
    )
    assert checkpoint["hyper_parameters"]["class_names"] == ["cat", "dog", "fish cake"]  # linked from the data
    logged = scalars(run_dir)
    assert {"train/loss_epoch", "train/top1", "val/top1", "val/ece"} <= logged.keys()  # the installed totals
    assert (run_dir / "config_hash.txt").is_file() and (run_dir / "logs" / "console.log").is_file()


def test_a_sigterm_mid_epoch_stops_with_a_checkpoint_and_the_resumed_run_ends_as_the_uninterrupted_one(
    trained, tmp_path
):
    (tmp_path / "photos").symlink_to(trained / "photos")
    stopped = reference(*FIT, cwd=tmp_path, check=False, env={"SIGNAL_AT": "1:3"})
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    reference(*FIT, "--ckpt_path=last", cwd=tmp_path)
    expected, actual = (only_run_dir(root) for root in (trained, tmp_path))
    assert expected.name == actual.name  # one config, one run folder name
    first, second = (torch.load(d / "checkpoints" / "last.ckpt", weights_only=True) for d in (expected, actual))
    assert first["global_step"] == second["global_step"] == 12  # 6 batches of 8 an epoch
    for name, tensor in first["state_dict"].items():
        assert torch.equal(tensor, second["state_dict"][name]), name
    for a, b in zip(first["optimizer_states"][0]["state"].values(), second["optimizer_states"][0]["state"].values(),
                    strict=True):  # fmt: skip
        assert torch.equal(a["momentum_buffer"], b["momentum_buffer"])
    assert first["calibration"] == second["calibration"]
    assert torch.equal(first["domain_bank"], second["domain_bank"])  # the "unknown" score's training features
    assert scalars(expected) == scalars(actual)  # every logged number, the stopped epoch's included


def test_test_and_predict_write_the_report_and_the_answers(trained):
    run_dir = only_run_dir(trained)
    reference("test", "--config", str(run_dir / "config.yaml"), "--ckpt_path=last", cwd=trained)
    (report,) = run_dir.glob("test/*/report.html")
    assert "fish cake" in report.read_text()
    reference("predict", "--config", str(run_dir / "config.yaml"), "--ckpt_path=last", cwd=trained)
    (predictions,) = run_dir.glob("predict/*/predictions.csv")
    rows = list(csv.DictReader(predictions.read_text().splitlines()))
    assert list(rows[0]) == ["image", "predicted", "probability", "unknown_because", "score", "top5"]
    assert len(rows) == 18 and all(float(row["score"]) <= 0 for row in rows)  # minus a distance: knn, the default


def test_the_export_computes_what_the_model_computes_and_its_card_carries_the_calibration(trained):
    last = only_run_dir(trained) / "checkpoints" / "last.ckpt"
    reference("export", "--ckpt_path", str(last), "--formats", "onnx", cwd=trained)
    card = json.loads((last.parent / "export" / "model.card.json").read_text())
    checkpoint = torch.load(last, weights_only=True)
    assert card["calibration"]["temperature"] == checkpoint["calibration"]["temperature"]
    assert card["class_names"] == ["cat", "dog", "fish cake"]
    assert str(trained) not in json.dumps(card)  # nothing of this machine
    photo = Image.open(next((trained / "photos" / "dog").iterdir())).convert("RGB").resize((32, 32))
    pixels = np.asarray(photo).transpose(2, 0, 1)[None].copy()
    session = onnxruntime.InferenceSession(str(last.parent / "export" / "model.onnx"))
    (exported,) = session.run([card["output"]["name"]], {card["input"]["name"]: pixels})
    model = ReferenceClassifier.load_from_checkpoint(last, map_location="cpu", weights_only=True).eval()
    with torch.no_grad():
        eager = model.network()(torch.from_numpy(pixels))
    np.testing.assert_allclose(exported, eager.numpy(), atol=1e-4)


def test_the_exported_score_output_answers_unknown_by_the_card_s_rule(trained, tmp_path):
    """The second output of the ONNX file is the model's knn score, and the card's threshold on it says unknown
    for images of another kind: recounted here with onnxruntime, on the judged images and on patterns."""
    from .test_unknown import write_patterns

    last = only_run_dir(trained) / "checkpoints" / "last.ckpt"
    output = tmp_path / "export"
    reference("export", "--ckpt_path", str(last), "--formats", "onnx", "--output_dir", str(output), cwd=trained)
    card = json.loads((output / "model.card.json").read_text())
    rule = card["calibration"]["unknown"]["unlike_training"]
    assert card["score_output"]["name"] == "score" and rule["score"] == "knn"
    session = onnxruntime.InferenceSession(str(output / "model.onnx"))
    assert [o.name for o in session.get_outputs()] == ["logits", "score"]
    model = ReferenceClassifier.load_from_checkpoint(last, map_location="cpu", weights_only=True).eval()
    model.calibration.restore_from(torch.load(last, weights_only=True))
    validation = np.stack([np.asarray(Image.open(path).convert("RGB").resize((32, 32))).transpose(2, 0, 1)
                           for path in sorted((trained / "photos").rglob("*.*"))])  # fmt: skip
    write_patterns(tmp_path / "patterns")
    patterns = np.stack([np.asarray(Image.open(path).convert("RGB").resize((32, 32))).transpose(2, 0, 1)
                         for path in sorted((tmp_path / "patterns").iterdir())])  # fmt: skip
    for images in (validation, patterns):
        scores = session.run(["score"], {"images": images})[0]
        with torch.no_grad():
            logits, features = model.network()(torch.from_numpy(images)), model.features(torch.from_numpy(images))
        eager = model.calibration.domain_scores(logits, features)
        np.testing.assert_allclose(scores, eager.numpy(), atol=1e-3)
    unlike = session.run(["score"], {"images": patterns})[0] < rule["threshold"]
    assert unlike.sum() >= 11  # the card's rule, on the file's own output
    assert card["artifacts"]["onnx"]["unlike_training_images"] is not None


def test_a_model_without_a_method_of_the_contract_is_refused_in_one_line_before_anything_is_written(tmp_path):
    write_image_folder(tmp_path / "photos")
    before = tree(tmp_path)
    result = reference("NoFeatures", "fit", "--data.image_dir=photos", cwd=tmp_path, check=False, script="probes.py")
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [
        "error: NoFeatures lacks features() of classifier_engine.ClassifierModel; "
        "add them (the project's models/classifier.py shows each one)"
    ]
    assert tree(tmp_path) == before


def test_a_shared_checkpoint_naming_a_shell_command_is_refused_and_never_runs_it(trained, tmp_path):
    last = only_run_dir(trained) / "checkpoints" / "last.ckpt"
    marker = tmp_path / "ran"
    checkpoint = torch.load(last, weights_only=True)  # plain data: dicts, strings and tensors
    checkpoint["hyper_parameters"]["optimizer"] = {
        "class_path": "os.system",
        "init_args": {"command": f"touch {marker}"},
    }
    shared = tmp_path / "shared.ckpt"
    torch.save(checkpoint, shared)
    before = shared.read_bytes()
    for command in (
        ["predict", "--data.image_dir=photos", f"--ckpt_path={shared}"],
        ["export", "--ckpt_path", str(shared)],
    ):
        result = reference(*command, cwd=trained, check=False)
        assert result.returncode != 0 and not marker.exists()
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-2000:]
        assert "hyper_parameters.optimizer is not an argument of ReferenceClassifier" in lines[0]
    assert shared.read_bytes() == before
