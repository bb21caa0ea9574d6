"""``predict`` through the real CLI: a CSV per run, on the test split or on a folder of your own images."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from .conftest import DATASET, FAST_ARGS, NUM_TEST, default_config, fit_args, only_run_dir, run_cli, write_tiny_archive

pytestmark = pytest.mark.filterwarnings("ignore:.*does not have many workers.*:UserWarning")


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("predict")
    write_tiny_archive(root / "data")
    run_cli(*fit_args("data"), cwd=root)
    return root


def predict(root: Path, *extra: str):
    args = ["predict", "--config", str(default_config()), *FAST_ARGS, "--data.data_dir=data", "--ckpt_path=last"]
    return run_cli(*args, *extra, cwd=root)


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
        assert top5[0] == [row["predicted"], row["probability"]]


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
