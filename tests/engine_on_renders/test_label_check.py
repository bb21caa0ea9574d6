"""check_labels.py through its command line: k ordinary fold runs, then the labels that look wrong, worst first."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from classifier_engine.testing import write_multilabel_images

from .conftest import PHOTO_ROOT, cli_env, images_args, write_image_folder

# Three short fits and the same command again, in CI (every_render); the several-labels ranking (two folds of 20
# epochs) with `pytest -m slow`: CI runs the fold machinery it shares with cross_validate.py (test_cross_validate).
pytestmark = pytest.mark.slow
EVERY_RENDER = pytest.mark.every_render

CLASSES = ("cat", "dog", "fish cake")


def photos_with_flipped_labels(root: Path) -> tuple[Path, set[str]]:
    """train/ of 3 x 40 photos with 6 (5 %) moved into another class's folder (the folds deal them all)."""
    photos = root / "photos"
    write_image_folder(photos / "train", CLASSES, per_class=40)
    flipped = set()
    for index, (source, target) in enumerate([(0, 1), (1, 2), (2, 0)] * 2):
        moved = next((photos / "train" / CLASSES[source]).glob(f"{index:03d}.*"))
        destination = photos / "train" / CLASSES[target] / f"flipped-{moved.name}"
        moved.rename(destination)
        flipped.add(str(destination))  # as the CSV names it: image_dir (here absolute) and the file
    return photos, flipped


def check_labels(root: Path, photos: Path, *extra: str, folds: int = 3) -> subprocess.CompletedProcess:
    fit_options = images_args(photos, "--trainer.max_epochs=4", "--model.backbone.width=8")[1:]
    return subprocess.run(
        [sys.executable, str(PHOTO_ROOT / "check_labels.py"), *fit_options, f"--folds={folds}", *extra],
        cwd=root, env=cli_env(), capture_output=True, text=True, timeout=900,
    )  # fmt: skip


@EVERY_RENDER
def test_flipped_labels_rank_at_the_top_of_the_label_check(tmp_path):
    photos, flipped = photos_with_flipped_labels(tmp_path)
    result = check_labels(tmp_path, photos, "--output=checks/issues.csv")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = list(csv.DictReader((tmp_path / "checks" / "issues.csv").read_text().splitlines()))
    assert rows and list(rows[0]) == ["file", "given_label", "suggested_label", "score"]
    scores = [float(row["score"]) for row in rows]
    assert scores == sorted(scores)  # worst (least likely label) first
    top = {row["file"] for row in rows[: 120 // 10]}  # the top 10 % of the 120 training images
    assert len(flipped & top) >= len(flipped) / 2, (sorted(flipped), rows[:12])
    for row in rows:
        if row["file"] in flipped:  # the suggestion is the class the photo was taken from
            assert row["suggested_label"] != row["given_label"]
    page = (tmp_path / "checks" / "issues.html").read_text()
    assert page.count("<figure>") == min(len(rows), 100) and page.count("data:image/png;base64,") == page.count(
        "<figure>"
    )

    # Each fold is an ordinary run: its own directory, config and checkpoints, validated on its fold.
    runs = sorted(tmp_path.glob("runs/images/*/checkpoints/last.ckpt"))
    assert len(runs) == 3
    folds = sorted(yaml.safe_load((run.parents[1] / "config.yaml").read_text())["data"]["init_args"]["fold"]
                   for run in runs)  # fmt: skip
    assert folds == [0, 1, 2]

    # The same command again resumes (reuses) those runs and finds the same labels; without --output, the
    # findings go beside the fold runs, named by the first fold's run.
    again = check_labels(tmp_path, photos)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("resumed from") == 3
    (beside,) = tmp_path.glob("runs/images/label_issues-*.csv")
    assert beside.with_suffix(".html").is_file() and f"Label check: {beside.relative_to(tmp_path)}" in again.stdout
    assert beside.read_text() == (tmp_path / "checks" / "issues.csv").read_text()
    assert (tmp_path / "runs" / "images" / beside.stem.removeprefix("label_issues-") / "config.yaml").is_file()
    assert len(list(tmp_path.glob("runs/images/*/checkpoints/last.ckpt"))) == 3


@EVERY_RENDER
def test_bad_options_are_one_line_and_write_nothing(tmp_path):
    photos, _ = photos_with_flipped_labels(tmp_path)
    for extra, message in ((["--folds=1"], "at least 2"), (["--data.folds=4"], "sets data.folds")):
        result = check_labels(tmp_path, photos, *extra, "--output=checks/issues.csv")
        assert result.returncode != 0
        assert result.stderr.strip().splitlines()[-1].startswith("error:") and message in result.stderr
    assert not (tmp_path / "checks").exists() and not (tmp_path / "runs").exists()


def test_labels_missing_from_a_multilabel_list_rank_at_the_top(tmp_path):
    # 240 photos listed with their patches' colours; 6 rows lose one of their labels (the patch is still there).
    csv_path = write_multilabel_images(tmp_path / "photos", count=240)
    header, *rows = csv_path.read_text().splitlines()
    dropped = {}
    for number, row in enumerate(rows):
        path, labels = row.split(",")
        if len(dropped) < 6 and number % 7 == 0 and labels:
            rows[number] = f"{path},{' '.join(labels.split()[1:])}"
            dropped[str(csv_path.parent / path)] = labels.split()[0]
    csv_path.write_text("\n".join([header, *rows]) + "\n")
    result = check_labels(
        tmp_path,
        csv_path,
        "--output=checks/issues.csv",
        "--trainer.max_epochs=20",
        "--model.backbone.width=16",
        folds=2,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    found = list(csv.DictReader((tmp_path / "checks" / "issues.csv").read_text().splitlines()))
    top = {row["file"] for row in found[:24]}  # the top 10 %
    assert len(dropped.keys() & top) >= len(dropped) / 2, (dropped, found[:12])
    # The suggestion (the labels the fold's model gives) mostly gives back the label that was taken away.
    restored = [
        row["file"] for row in found if row["file"] in dropped and dropped[row["file"]] in row["suggested_label"]
    ]
    assert len(restored) >= len(dropped) / 2, (dropped, found[:12])
