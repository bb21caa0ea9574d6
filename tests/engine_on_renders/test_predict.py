"""``predict`` through the real CLI: a CSV per run, on the test split or on a folder of your own images."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from .conftest import (
    DATASET,
    FAST_ARGS,
    NUM_TEST,
    default_config,
    only_run_dir,
    run_cli,
    run_data_of,
    trained_folder,
)

pytestmark = pytest.mark.filterwarnings("ignore:.*does not have many workers.*:UserWarning")


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    return trained_folder(tmp_path_factory.mktemp("predict"))


def predict(root: Path, *extra: str, check: bool = True):
    args = ["predict", "--config", str(default_config()), *FAST_ARGS, "--data.data_dir=data", "--ckpt_path=last"]
    return run_cli(*args, *extra, cwd=root, check=check)


def rows(root: Path, result) -> list[dict[str, str]]:
    (written,) = [line.split(": ", 1)[1] for line in result.stdout.splitlines() if line.startswith("Predictions: ")]
    path = root / written
    assert path.parent.parent.parent == only_run_dir(root) and path.parent.parent.name == "predict"
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_predict_writes_one_row_per_test_image(trained):
    table = rows(trained, predict(trained))
    assert [row["image"] for row in table] == [str(i) for i in range(NUM_TEST)]
    for row in table:
        top5 = [pair.rsplit(":", 1) for pair in row["top5"].split(" ")]
        assert len(top5) == 5 and {name for name, _ in top5} <= set(DATASET.class_names)
        probabilities = [float(p) for _, p in top5]
        assert probabilities == sorted(probabilities, reverse=True) and 0 < sum(probabilities) <= 1.0001
        # The top class, or "unknown" below the rejection threshold fitted on the validation images.
        assert row["predicted"] in (top5[0][0], "unknown") and top5[0][1] == row["probability"]
    record = torch.load(next(trained.glob("runs/*/*/checkpoints/last.ckpt")), weights_only=False)["calibration"]
    threshold, unlike = record["rejection"]["threshold"], record["domain"]["threshold"]
    for (
        row
    ) in table:  # unknown: unlike the training images by the knn score, or a likely mistake by the top probability
        if row["unknown_because"] == "unlike the training images":
            assert row["predicted"] == "unknown" and float(row["score"]) < unlike + 1e-4
            continue
        assert float(row["score"]) >= unlike - 1e-4
        assert (row["predicted"] == "unknown") == (float(row["probability"]) < threshold - 1e-4) or (
            abs(float(row["probability"]) - threshold) < 1e-4
        )
        assert row["unknown_because"] == ("likely a mistake" if row["predicted"] == "unknown" else "")


def test_predict_may_switch_the_unknown_score_on_a_trained_model(trained):
    """The checkpoint keeps both scores' thresholds: energy's answers are the model's own, at its threshold."""
    from cifar_classifier.models import ImageClassifier

    table = rows(trained, predict(trained, "--model.reject_with=energy"))
    last = next(trained.glob("runs/*/*/checkpoints/last.ckpt"))
    checkpoint = torch.load(last, map_location="cpu", weights_only=False)
    model = ImageClassifier.load_from_checkpoint(last, map_location="cpu", reject_with="energy").eval()
    calibration = model.calibration
    assert float(calibration.domain_threshold) == pytest.approx(
        checkpoint["calibration"]["domain"]["thresholds"]["energy"], rel=1e-6
    )
    held_out = run_data_of(last, trained / "data").held_out
    with torch.inference_mode():
        logits = model.evaluate(torch.from_numpy(np.array(held_out.images[:])))
        energy, top = calibration.scores(logits, "energy"), calibration.scores(logits, "msp")
    margins = zip((energy - calibration.domain_threshold).tolist(), (top - calibration.rejection).tolist(), strict=True)
    for row, (unlike, unsure) in zip(table, margins, strict=True):  # (within 1e-4 of a threshold: either way)
        assert float(row["score"]) == pytest.approx(unlike + float(calibration.domain_threshold), abs=1e-3)
        if min(abs(unlike), abs(unsure)) > 1e-4:
            assert (row["predicted"] != "unknown") == (unlike >= 0 and unsure >= 0)
    assert 0 < sum(row["predicted"] == "unknown" for row in table) < len(table)


def test_predict_on_a_folder_of_own_images_skips_the_unreadable_one(trained):
    folder = trained / "my_images"
    (folder / "nested").mkdir(parents=True)
    Image.fromarray(np.full((48, 40, 3), 200, np.uint8)).save(folder / "big.png")  # resized to 32x32
    Image.fromarray(np.zeros((20, 20), np.uint8)).save(folder / "nested" / "gray.jpg")  # one channel
    Image.fromarray(np.zeros((32, 32, 4), np.uint8)).save(folder / "alpha.png")  # four channels
    (folder / "broken.png").write_bytes(b"not an image")
    result = predict(trained, f"--data.predict_dir={folder}")
    assert [row["image"] for row in rows(trained, result)] == ["alpha.png", "big.png", "nested/gray.jpg"]
    assert f"skipped {folder / 'broken.png'}: not a readable image" in result.stderr


def test_predict_on_own_images_needs_no_cifar_archive_and_takes_upper_case_names(trained):
    folder = trained / "camera"
    folder.mkdir()
    Image.fromarray(np.full((32, 32, 3), 90, np.uint8)).save(folder / "PHOTO.JPG", format="JPEG")
    Image.fromarray(np.full((32, 32, 3), 30, np.uint8)).save(folder / "Scan.PNG", format="PNG")
    (folder / "notes.TXT").write_text("not an image, and not named like one")
    # No archive and no converted data in this folder, and nothing may be downloaded.
    result = predict(trained, f"--data.predict_dir={folder}", "--data.data_dir=no_cifar_here", "--data.download=false")
    assert [row["image"] for row in rows(trained, result)] == ["PHOTO.JPG", "Scan.PNG"]
    assert not (trained / "no_cifar_here").exists()


@pytest.mark.parametrize(
    "problem",
    [
        "missing",
        pytest.param("empty-folder", marks=pytest.mark.slow),  # the quick tier keeps one: a process start each
        pytest.param("not-a-folder", marks=pytest.mark.slow),
    ],
)
def test_a_predict_folder_without_images_is_one_line_and_leaves_nothing(trained, problem):
    target = trained / f"bad-{problem}"
    if problem == "empty-folder":
        (target / "nested").mkdir(parents=True)  # folders, but no image anywhere
    elif problem == "not-a-folder":
        target.write_bytes(b"a file")
    runs_before = sorted(p for p in (trained / "runs").rglob("*"))
    result = predict(trained, f"--data.predict_dir={target}", check=False)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode == 2 and len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert f"data.predict_dir={target}" in errors[0] and "; " in errors[0]
    assert sorted(p for p in (trained / "runs").rglob("*")) == runs_before  # no predict folder left behind
