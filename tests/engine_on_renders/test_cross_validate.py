"""cross_validate.py through its command line: k ordinary fold runs, every figure with its spread, every image's
out-of-fold answer, a report; groups kept in one fold; a stopped cross-validation continued exactly."""

from __future__ import annotations

import contextlib
import csv
import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import onnxruntime
import pytest
import torch
from photo_classifier.models import ImageClassifier as PhotoClassifier
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from .conftest import PHOTO_ROOT, cli_env, images_args, write_image_folder

CLASSES = ("cat", "dog", "fish cake")
FOLDS = 3


def photos_with_subjects(root: Path) -> Path:
    """train/ of 3 x 12 photos (cat's in 3 subject folders of 4: each subject must stay in one fold) and val/."""
    photos = root / "photos"
    write_image_folder(photos / "train", CLASSES, per_class=12)
    write_image_folder(photos / "val", CLASSES, per_class=4)
    for path in sorted((photos / "train" / "cat").iterdir()):
        subject = photos / "train" / "cat" / f"subject{int(path.stem) // 4}"
        subject.mkdir(exist_ok=True)
        path.rename(subject / path.name)
    return photos


def command(script: str, root: Path, photos: Path, *extra: str, env: dict[str, str] | None = None):
    fit_options = images_args(photos, "--trainer.max_epochs=2")[1:]
    return subprocess.run(
        [sys.executable, str(PHOTO_ROOT / script), *fit_options, f"--folds={FOLDS}", *extra],
        cwd=root, env=cli_env(**(env or {})), capture_output=True, text=True, timeout=900,
    )  # fmt: skip


def digests(root: Path) -> dict[str, str]:
    """Every fold run's last checkpoint and its bytes' digest."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.glob("runs/*/*/checkpoints/last.ckpt"))
    }


def runs_by_fold(root: Path) -> dict[int | None, Path]:
    """Each fold's run folder, by the fold its config holds out (None: the final model's, which holds none out)."""
    runs = {}
    for config in root.glob("runs/*/*/config.yaml"):
        line = next(line for line in config.read_text().splitlines() if line.strip().startswith("fold:"))
        value = line.split(":")[1].strip()
        runs[None if value == "null" else int(value)] = config.parent
    return runs


def best_epoch_count(run_dir: Path) -> int:
    """After how many epochs the run validated best: the highest val/top1, ties to the lower val/loss."""
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    loss = {event.step: event.value for event in events.Scalars("val/loss")}
    epoch = {event.step: event.value for event in events.Scalars("epoch")}
    best = max(events.Scalars("val/top1"), key=lambda event: (event.value, -loss[event.step]))
    return int(epoch[best.step]) + 1


def last_logged(run_dir: Path, tag: str) -> float:
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return events.Scalars(tag)[-1].value


@pytest.mark.slow  # five folds, a final model and its export: the full tier (-m slow); CI runs the fold runner
# through check_labels.py (test_label_check) and the folds' verdict through its unit test
def test_one_command_cross_validates_a_folder_and_check_labels_reuses_its_folds(tmp_path):
    photos = photos_with_subjects(tmp_path)
    refused = command("cross_validate.py", tmp_path, photos)
    lines = [line for line in refused.stderr.splitlines() if line.startswith("error: ")]
    assert refused.returncode == 2 and len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert "own val split" in lines[0] and "data.pool_val" in lines[0]
    for extra, says in ((["--data.fold=1"], "sets data.folds and data.fold itself; use --folds and --fold"),
                        (["--ckpt_path", "best"], "argument --ckpt_path: invalid choice: 'best'")):  # fmt: skip
        refused = command("cross_validate.py", tmp_path, photos, "--data.pool_val=true", *extra)
        lines = [line for line in refused.stderr.splitlines() if line.startswith("error: ")]
        assert refused.returncode == 2 and len(lines) == 1 and says in lines[0], refused.stderr[-2000:]
    assert not (tmp_path / "runs").exists()  # refused before anything was made

    # The folds side by side, as a SLURM array's tasks (--fold K each), then the summary job: it trains none again.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/bash\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "python").chmod(0o755)
    (tmp_path / "cross_validate.py").symlink_to(PHOTO_ROOT / "cross_validate.py")
    job = {"SLURM_SUBMIT_DIR": str(tmp_path), "VIRTUAL_ENV": sys.prefix, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    script = ["bash", str(PHOTO_ROOT / "scripts" / "cross_validate_array.sbatch")]
    fit_options = [*images_args(photos, "--trainer.max_epochs=2")[1:], f"--folds={FOLDS}", "--data.pool_val=true"]
    for fold in range(FOLDS):
        task = {**job, "SLURM_ARRAY_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": str(fold)}
        done = subprocess.run([*script, *fit_options], cwd=tmp_path, env=cli_env(**task), capture_output=True,
                              text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0 and f"Fold {fold} is trained" in done.stdout, done.stderr[-3000:]
        assert len(digests(tmp_path)) == fold + 1 and not list(tmp_path.glob("runs/*/cv-*"))
    trained = digests(tmp_path)
    result = subprocess.run([*script, *fit_options], cwd=tmp_path, env=cli_env(**job), capture_output=True,
                            text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summarized = digests(tmp_path)
    assert trained.items() <= summarized.items() and len(summarized) == FOLDS + 1  # no fold again; the final run
    (cv_dir,) = tmp_path.glob("runs/*/cv-*")
    assert {path.name for path in cv_dir.iterdir()} == {
        "cv_summary.csv", "cv_report.html", "oof_predictions.csv", "tensorboard"
    }  # fmt: skip
    assert "95 % interval" in result.stdout and f"Cross-validation: {cv_dir.relative_to(tmp_path)}" in result.stdout

    # Every image, train/ and val/ pooled, is answered once, by the fold that held it out; a subject stays together.
    rows = list(csv.DictReader((cv_dir / "oof_predictions.csv").read_text().splitlines()))
    images = sorted(str(path) for path in photos.rglob("*.*"))
    assert sorted(row["image"] for row in rows) == images
    subjects = {}
    for row in rows:
        if "/subject" in row["image"]:
            subjects.setdefault(Path(row["image"]).parent.name, set()).add(row["fold"])
    assert len(subjects) == 3 and all(len(folds) == 1 for folds in subjects.values())
    for row in rows:
        probabilities = [float(row[f"p:{name}"]) for name in CLASSES]
        answer = CLASSES[probabilities.index(max(probabilities))]
        assert abs(sum(probabilities) - 1) < 1e-3 and row["predicted"] == answer

    # Each fold's figures are what its run logged on the same images; the summary holds their spread.
    summary = {row["figure"]: row for row in csv.DictReader((cv_dir / "cv_summary.csv").read_text().splitlines())}
    by_fold = runs_by_fold(tmp_path)
    final_run = by_fold.pop(None)
    assert sorted(by_fold) == list(range(FOLDS))
    for fold, run in by_fold.items():
        for figure, tag in (("top1", "val/top1"), ("ece", "val/ece")):
            assert abs(float(summary[figure][f"fold_{fold}"]) - last_logged(run, tag)) < 1e-4, (figure, fold)
    top1 = [float(summary["top1"][f"fold_{fold}"]) for fold in range(FOLDS)]
    assert abs(float(summary["top1"]["mean"]) - sum(top1) / FOLDS) < 1e-6
    assert float(summary["top1"]["ci95_low"]) <= float(summary["top1"]["mean"]) <= float(summary["top1"]["ci95_high"])
    assert {"macro_f1", "balanced_accuracy", "recall/cat", "recall/fish cake"} <= summary.keys()

    events = EventAccumulator(str(cv_dir / "tensorboard"))
    events.Reload()
    assert [event.step for event in events.Scalars("cv/top1")] == list(range(FOLDS))
    page = (cv_dir / "cv_report.html").read_text()
    for section in ("Summary", "val/top1 of each fold", "Pooled confusion matrix", "The fold runs"):
        assert f"<h2>{section}</h2>" in page

    # The final model: every image (train/ and val/ pooled) for the folds' mean best epoch count, validating none;
    # calibrated on the folds' answers to all 48 images, its bank its own 48; exported, its card citing the folds.
    epochs = round(sum(best_epoch_count(run) for run in by_fold.values()) / FOLDS)
    assert f"max_epochs: {epochs}\n" in (final_run / "config.yaml").read_text()
    assert "48 training and 0 validation images" in (final_run / "logs" / "console.log").read_text()
    final = torch.load(final_run / "checkpoints" / "final.ckpt", weights_only=True)
    assert final["epoch"] == epochs - 1 and final["calibration"]["fitted_on"]["split"] == "out-of-fold"
    assert final["calibration"]["fitted_on"]["images"] == 48 and final["calibration"]["domain"]["bank_images"] == 48
    assert final["cross_validation"]["figures"]["top1"]["mean"] == pytest.approx(float(summary["top1"]["mean"]))
    last = torch.load(final_run / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["calibration"]["fitted_on"] is None  # training wrote it, validating nothing; final.ckpt is derived
    exported = final_run / "checkpoints" / "export"
    assert {path.name for path in exported.iterdir()} == {"model.onnx", "model.pt2", "model.card.json", "model.card.md"}
    card = (exported / "model.card.md").read_text()
    assert f"Cross-validated ({FOLDS} folds; this model: every image, {epochs} epochs): top-1 " in card
    assert f"top-1 {100 * float(summary['top1']['mean']):.1f} %" in card and "the folds' out-of-fold answers" in card
    assert f"Final model: {final_run.relative_to(tmp_path)}/checkpoints/final.ckpt" in result.stdout
    shipped = page.split("<h2>The model to ship</h2>")[1].split("<h2>")[0]  # the report names it once it is made
    assert f"{final_run.relative_to(tmp_path)}/checkpoints/final.ckpt" in shipped and f"{epochs} epochs" in shipped
    # The same command again trains nothing, and keeps the final model and its export as they are.
    kept = {path: path.read_bytes() for path in [final_run / "checkpoints" / "final.ckpt", *exported.iterdir()]}
    again = subprocess.run([*script, *fit_options], cwd=tmp_path, env=cli_env(**job), capture_output=True,
                           text=True, timeout=600)  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert digests(tmp_path) == summarized and all(path.read_bytes() == data for path, data in kept.items())
    # export.py's default formats leave int8 out for it (nothing is held out to judge int8 on); asked for, refused.
    int8 = subprocess.run([sys.executable, str(PHOTO_ROOT / "export.py"), "--ckpt_path", str(final_run / "checkpoints"
                           / "final.ckpt"), "--formats=int8"], cwd=tmp_path, env=cli_env(), capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    (line,) = int8.stderr.strip().splitlines()
    assert int8.returncode == 2 and line.startswith("error: the run trained on every image and holds none out")
    assert all(path.read_bytes() == data for path, data in kept.items()) and len(list(exported.iterdir())) == 4

    # check_labels.py with the same options ranks from the same fold runs: none is trained again.
    before = digests(tmp_path)
    checked = command("check_labels.py", tmp_path, photos, "--data.pool_val=true", "--output=issues.csv")
    assert checked.returncode == 0, checked.stderr[-3000:]
    assert digests(tmp_path) == before and len(before) == FOLDS + 1
    assert (tmp_path / "issues.csv").is_file()

    # --final ensemble: the fold models as one graph beside the summary, no fold trained again. Its softmax is the
    # mean of each fold model's calibrated probabilities, as the project's model class computes them; its score beside.
    ensembled = command("cross_validate.py", tmp_path, photos, "--data.pool_val=true", "--final=ensemble")
    assert ensembled.returncode == 0, ensembled.stderr[-3000:]
    assert digests(tmp_path) == before and "Fold ensemble: " in ensembled.stdout
    folder = cv_dir / "ensemble"
    assert {path.name for path in folder.iterdir()} == {"model.onnx", "model.pt2", "model.card.json", "model.card.md"}
    images = torch.randint(0, 256, (5, 3, 32, 32), dtype=torch.uint8)
    expected = []
    for run in by_fold.values():
        model = PhotoClassifier.load_from_checkpoint(run / "checkpoints" / "last.ckpt", map_location="cpu").eval()
        model.calibration.restore_from(torch.load(run / "checkpoints" / "last.ckpt", weights_only=True))
        with torch.no_grad():
            expected.append(model.network()(images))
    logits, score = onnxruntime.InferenceSession(str(folder / "model.onnx")).run(None, {"images": images.numpy()})
    mean = torch.stack([answer.softmax(-1) for answer in expected]).mean(0)
    assert torch.allclose(torch.from_numpy(logits).softmax(-1), mean, atol=1e-5) and score.shape == (5,)
    card = (folder / "model.card.md").read_text()
    assert f"From: the mean of {FOLDS} fold models" in card and "answer 'unknown' where output 'score' < 0" in card
    shipped = (cv_dir / "cv_report.html").read_text().split("<h2>The model to ship</h2>")[1].split("<h2>")[0]
    assert "fold ensemble" in shipped and "final.ckpt" not in shipped


@pytest.mark.slow
def test_a_cross_validation_stopped_mid_fold_continues_exactly(tmp_path):
    """SIGTERM in fold 0's second epoch; the same command again trains the rest of fold 0, the other folds and the
    final model, and ends where an uninterrupted cross-validation does: the same weights and the same summary."""
    import torch

    roots = {name: tmp_path / name for name in ("uninterrupted", "stopped")}
    probe = "--trainer.callbacks+=engine_probes.KillAt"  # in both: one config; it acts where KILL_AT is set
    for root in roots.values():
        photos_with_subjects(root)
    uninterrupted = command("cross_validate.py", roots["uninterrupted"], roots["uninterrupted"] / "photos",
                            "--data.pool_val=true", probe)  # fmt: skip
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-3000:]
    root = roots["stopped"]
    fit_options = images_args(root / "photos", "--trainer.max_epochs=2")[1:]
    process = subprocess.Popen(
        [sys.executable, str(PHOTO_ROOT / "cross_validate.py"), *fit_options, f"--folds={FOLDS}",
         "--data.pool_val=true", probe],
        cwd=root, env=cli_env(KILL_AT="train_batch:1:1", KILL_SIGNAL="SIGTERM"), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        _, stderr = process.communicate(timeout=600)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert list(runs_by_fold(root)) == [0]  # fold 0 stopped in its second epoch; no other fold began
    continued = command("cross_validate.py", root, root / "photos", "--data.pool_val=true", probe)
    assert continued.returncode == 0, continued.stderr[-3000:]
    expected, actual = (runs_by_fold(r) for r in roots.values())
    assert expected.keys() == actual.keys() == {*range(FOLDS), None}  # and the final model's run
    for fold in [*range(FOLDS), None]:
        weights = [torch.load(runs[fold] / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
                   for runs in (expected, actual)]  # fmt: skip
        assert weights[0].keys() == weights[1].keys()
        assert all(torch.equal(weights[0][key], weights[1][key]) for key in weights[0]), fold
    summaries = [next(r.glob("runs/*/cv-*/cv_summary.csv")).read_text() for r in roots.values()]
    assert summaries[0] == summaries[1]


@pytest.mark.slow
def test_compare_trains_two_configs_on_the_same_folds_and_gives_the_paired_differences(tmp_path):
    """B differs from A by one setting; each fold's difference is B's figure minus A's on the same images."""
    photos = tmp_path / "photos"
    write_image_folder(photos, CLASSES, per_class=12)
    options = images_args(photos, "--trainer.max_epochs=2")[1:]
    at = options.index(str(PHOTO_ROOT / "configs" / "images.yaml"))
    del options[at - 1 : at + 1]  # the configs compared are whole configs: images.yaml, and it changed
    config_a = PHOTO_ROOT / "configs" / "images.yaml"
    config_b = tmp_path / "smoothed_less.yaml"
    config_b.write_text(config_a.read_text().replace("label_smoothing: 0.1", "label_smoothing: 0.0"))
    result = subprocess.run(
        [sys.executable, str(PHOTO_ROOT / "cross_validate.py"), "--compare", str(config_a), str(config_b),
         *options, f"--folds={FOLDS}"],
        cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    (compare,) = tmp_path.glob("runs/*/compare-*/cv_compare.csv")
    summaries = {}
    for summary in tmp_path.glob("runs/*/cv-*/cv_summary.csv"):
        rows = {row["figure"]: row for row in csv.DictReader(summary.read_text().splitlines())}
        config = yaml_of_first_fold(tmp_path, summary.parent.name.removeprefix("cv-"))
        summaries["B" if "label_smoothing: 0.0" in config else "A"] = rows
    assert sorted(summaries) == ["A", "B"]
    for row in csv.DictReader(compare.read_text().splitlines()):
        a, b = summaries["A"][row["figure"]], summaries["B"][row["figure"]]
        for fold in range(FOLDS):
            expected = float(b[f"fold_{fold}"]) - float(a[f"fold_{fold}"])
            assert abs(float(row[f"fold_{fold}"]) - expected) < 1e-5, (row["figure"], fold)
        assert float(row["ci95_low"]) <= float(row["b_minus_a"]) <= float(row["ci95_high"])
        assert row["verdict"] in ("A better", "B better", "no difference shown")
    assert "B - A" in result.stdout and f"Comparison: {compare.relative_to(tmp_path)}" in result.stdout


def yaml_of_first_fold(root: Path, run_name: str) -> str:
    (config,) = root.glob(f"runs/*/{run_name}/config.yaml")
    return config.read_text()
