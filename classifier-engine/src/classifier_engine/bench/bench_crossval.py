"""How far a cross-validated estimate lies from photos the folds never saw, and what cross_validate.py costs.

    python -m classifier_engine.bench crossval --sets ants_bees/ clothing/ --weights_path FILE
        [--folds 5] [--epochs 5] [--test_fraction 0.3] [--seed 0] [--accuracy_only] [--quick]

Each set is a folder of class folders (or of ``train/`` and ``val/`` folders, pooled). A seeded, stratified
share (``--test_fraction``) is held out as the test split, which no fold and no model here trains or
validates on. ``--seed`` draws that split, deals the folds (``data.split_seed``) and seeds the training
(``seed_everything``): run a few to see how much of a gap is the draw. On the rest, with the photo config as
shipped:

- ``cross_validate.py --folds k``: the cross-validated top-1, its 95 % interval, and its wall time;
- the same k fold runs as k separate ``main.py fit`` commands (``data.folds``, ``data.fold``), timed: the
  overhead of one command over k (and each fold's fit alone, both ways, in the JSON: where the time went);
- the final model (``--final all``: every photo, the folds' mean best epoch count, calibrated on the folds'
  out-of-fold answers): its top-1 on the test split, and the share of test photos it keeps as like the
  training ones (its "unknown" threshold was fitted on no image of its own; the goal is ``keep_in_domain``);
- a single-split model (``main.py fit``, a tenth of each class validated, the same test photos): the same
  two figures;
- each fold model's top-1 on the test split, and the k fold models' as an ensemble (their calibrated
  probabilities averaged).

It prints, per set: the estimate and its interval, the single-split, fold, final and ensemble test top-1,
whether the single-split and final models' test top-1 lie inside the interval, the shares kept, and the time
ratio (the cross-validation without its final model against k separate fits, each timed once, one after the
other: on a shared machine drift weighs on it, so compare it over runs, or time the two commands in turn;
each fold's fit time, both ways, shows whether the folds themselves differ). The last line is one JSON
object of every figure, with what the test split's own size allows: each test top-1's 95 % (Wilson)
interval, and whether the estimate lies inside it (the folds' interval leaves the test split's own noise
out), and the photos only the final or only the single-split model gets right, with McNemar's exact p.
``--quick`` (what the tests run) checks the script works on generated photos from random weights; its figures
mean nothing.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from ..checkpoints.checkpoint_io import stored_entry
from ..export.model_loading import load_model
from ..export.run_data import load_run_data
from ..models.domain import find_head
from ..models.network_parts import logits_and_features
from .bench_unknown import write_quick_sets
from .project import PROJECT_ROOT as PROJECT
from .project import ImageClassifier

IMAGES_CONFIG = PROJECT / "configs" / "images.yaml"


def options(args: argparse.Namespace, data: Path) -> list[str]:
    """The fit options every command of the benchmark shares (its own work is named by what it adds)."""
    weights = [f"--model.backbone.weights_path={args.weights_path}"] if args.weights_path else []
    pooled = ["--data.pool_val=true"] if (data / "val").is_dir() else []
    return [
        "--config",
        str(IMAGES_CONFIG),
        *weights,
        *args.extra,
        *pooled,
        f"--data.image_dir={data}",
        f"--data.test_fraction={args.test_fraction}",
        f"--data.split_seed={args.seed}",
        f"--trainer.max_epochs={args.epochs}",
        f"--seed_everything={args.seed}",
        "--trainer.enable_progress_bar=false",
    ]


def timed(command: list[str], cwd: Path) -> float:
    """Wall seconds of ``command`` (a failure ends the benchmark in one line)."""
    cwd.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"error: {' '.join(command[1:3])} failed: {(result.stderr.strip().splitlines() or ['?'])[-1]}")
    return time.perf_counter() - start


class TestAnswers(NamedTuple):
    """A checkpoint's answers on its run's test split, photo by photo (in ``names`` order)."""

    top1: float
    in_domain: float  # the share its calibration calls like the training photos (the goal: ``keep_in_domain``)
    probabilities: np.ndarray  # calibrated, (photos, classes)
    labels: np.ndarray
    right: np.ndarray  # its top class (of the logits) is the label
    names: list[str]  # each photo's file: what pairs two runs' answers


def on_test(checkpoint_path: Path) -> TestAnswers:
    """A checkpoint's answers on its run's test split, with its own views and its own "unknown" threshold."""
    model, checkpoint = load_model(checkpoint_path, ImageClassifier)
    model.eval()
    data = load_run_data(checkpoint_path, checkpoint, list(model.class_names), None, "the benchmark").datamodule
    test = data.held_out_images()
    images, labels = np.asarray(test.images[:]), np.asarray(test.labels)
    head = find_head(model, torch.from_numpy(images[:1]))
    logits, inside = [], []
    with torch.no_grad():
        for start in range(0, len(images), 64):
            batch = torch.from_numpy(images[start : start + 64])
            out, features = logits_and_features(head, lambda batch=batch: model.evaluate(batch))
            logits.append(out)
            inside.append(model.calibration.in_domain(out, features))
    logits = torch.cat(logits)
    right = logits.argmax(1).numpy() == labels
    in_domain = float(torch.cat(inside).float().mean())
    probabilities = model.calibration.probabilities(logits).numpy()
    return TestAnswers(float(right.mean()), in_domain, probabilities, labels, right, list(test.names))


def paired(answers: list[TestAnswers], who: str) -> list[TestAnswers]:
    """``answers`` in the first one's photo order: runs compared photo by photo must be tested on the same
    photos (a single-split run draws the same test split as the folds: ``stratified_split``)."""
    order = answers[0].names
    aligned = [answers[0]]
    for answer in answers[1:]:
        if sorted(answer.names) != sorted(order):
            sys.exit(
                f"error: {who} were tested on different photos, so they cannot be compared; the data module "
                "must draw one test split for every validation share (stratified_split does)"
            )
        where = {name: index for index, name in enumerate(answer.names)}
        index = np.array([where[name] for name in order])
        aligned.append(
            answer._replace(
                probabilities=answer.probabilities[index],
                labels=answer.labels[index],
                right=answer.right[index],
                names=order,
            )
        )
    return aligned


def wilson(correct: int, total: int) -> list[float]:
    """The 95 % Wilson interval of a top-1 on ``total`` test photos: how much of a gap the test split's own
    size can explain, beside the cross-validated interval."""
    if total == 0:
        return [0.0, 1.0]
    z, share = 1.959964, correct / total
    centre = (share + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(share * (1 - share) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return [max(0.0, centre - half), min(1.0, centre + half)]


def mcnemar(only_a: int, only_b: int) -> float:
    """The exact two-sided McNemar p-value of two models answering the same photos: how likely their split of
    the photos only one of them gets right would be if neither were better (a fair coin per such photo)."""
    disagreements = only_a + only_b
    if disagreements == 0:
        return 1.0
    tail = sum(math.comb(disagreements, k) for k in range(min(only_a, only_b) + 1)) / 2**disagreements
    return min(1.0, 2 * tail)


def fold_runs(root: Path) -> dict[int | None, Path]:
    """The run folders under ``root`` by the fold their config holds out (None: a final model's, none)."""
    runs = {}
    for config in root.glob("runs/*/*/config.yaml"):
        line = next(line for line in config.read_text().splitlines() if line.strip().startswith("fold:"))
        value = line.split(":", 1)[1].strip()
        runs[None if value == "null" else int(value)] = config.parent
    return runs


def fit_seconds(runs: dict[int | None, Path]) -> list[float]:
    """Each fold run's training time, fold by fold: from its config (written as fit starts) to its last
    checkpoint (written as it ends). Set against the whole command's, it shows where the time went."""
    return [
        (run / "checkpoints" / "last.ckpt").stat().st_mtime - (run / "config.yaml").stat().st_mtime
        for fold, run in sorted((fold, run) for fold, run in runs.items() if fold is not None)
    ]


def one_set(args: argparse.Namespace, data: Path, scratch: Path) -> dict:
    shared = options(args, data)
    cv_root, separate_root, single_root = scratch / "cv", scratch / "separate", scratch / "single"
    cross_validate = [sys.executable, str(PROJECT / "cross_validate.py"), *shared, f"--folds={args.folds}"]
    cv_seconds = timed([*cross_validate, "--final=none"], cv_root)
    fold_command = [sys.executable, str(PROJECT / "main.py"), "fit", *shared, f"--data.folds={args.folds}"]
    separate_seconds = (
        math.nan
        if args.accuracy_only
        else sum(timed([*fold_command, f"--data.fold={fold}"], separate_root) for fold in range(args.folds))
    )
    final_seconds = timed([*cross_validate, "--final=all"], cv_root)  # the folds reused: the final model alone
    timed([sys.executable, str(PROJECT / "main.py"), "fit", *shared], single_root)
    (summary_path,) = cv_root.glob("runs/*/cv-*/cv_summary.csv")
    top1 = next(row for row in csv.DictReader(summary_path.read_text().splitlines()) if row["figure"] == "top1")
    (single_last,) = single_root.glob("runs/*/*/checkpoints/last.ckpt")
    runs = fold_runs(cv_root)
    cv_fits = fit_seconds(runs)
    separate_fits = fit_seconds(fold_runs(separate_root)) if not args.accuracy_only else []
    final_run = runs.pop(None)
    final, *fold_answers, single = paired(
        [on_test(final_run / "checkpoints" / "final.ckpt")]
        + [on_test(run / "checkpoints" / "last.ckpt") for run in runs.values()]
        + [on_test(single_last)],
        "the fold, final and single-split models",
    )
    # The folds as an ensemble: their calibrated probabilities averaged, photo by photo.
    mean_probabilities = np.mean([answer.probabilities for answer in fold_answers], axis=0)
    ensemble_test = float((mean_probabilities.argmax(1) == final.labels).mean())
    only_final, only_single = int((final.right & ~single.right).sum()), int((single.right & ~final.right).sum())
    low, high = float(top1["ci95_low"]), float(top1["ci95_high"])
    single_interval = wilson(int(single.right.sum()), len(single.labels))
    final_interval = wilson(int(final.right.sum()), len(final.labels))
    return {
        "cv_top1": float(top1["mean"]),
        "cv_ci95": [low, high],
        "cv_std": float(top1["std"]),
        "single_split_test_top1": single.top1,
        "fold_models_test_top1": statistics.mean(answer.top1 for answer in fold_answers),
        "final_model_test_top1": final.top1,
        "fold_ensemble_test_top1": ensemble_test,
        "final_model_epochs": int(stored_entry(final_run / "checkpoints" / "final.ckpt", "cross_validation")["epochs"]),
        "single_split_test_in_domain": single.in_domain,
        "final_model_test_in_domain": final.in_domain,
        "single_split_test_inside_interval": low <= single.top1 <= high,
        "final_model_test_inside_interval": low <= final.top1 <= high,
        "test_images": len(final.labels),
        "single_split_test_ci95": single_interval,
        "final_model_test_ci95": final_interval,
        # The other way round: the estimate inside what the test split's own size allows of each test figure.
        "cv_inside_single_split_test_ci95": single_interval[0] <= float(top1["mean"]) <= single_interval[1],
        "cv_inside_final_model_test_ci95": final_interval[0] <= float(top1["mean"]) <= final_interval[1],
        "only_final_model_right": only_final,
        "only_single_split_right": only_single,
        "final_vs_single_mcnemar_p": mcnemar(only_final, only_single),
        "seed": args.seed,
        "cv_seconds": cv_seconds,
        "separate_fits_seconds": separate_seconds,
        "final_model_seconds": final_seconds,
        "time_ratio": cv_seconds / separate_seconds,
        "cv_fold_fit_seconds": cv_fits,
        "separate_fold_fit_seconds": separate_fits,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", type=Path, nargs="+", help="folders of class folders (or train/ and val/)")
    parser.add_argument("--weights_path", type=Path, help="a local weights file of the config's network (offline)")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--test_fraction", type=float, default=0.3, help="share of each class no fold sees")
    parser.add_argument("--seed", type=int, default=0, help="the test split's draw, the folds' and the training's")
    parser.add_argument("--quick", action="store_true", help="a tiny run that checks the benchmark works")
    parser.add_argument(
        "--accuracy_only",
        action="store_true",
        help="leave out the k separate fits (no time ratio): the accuracy figures in half the time",
    )
    args = parser.parse_args()
    args.extra = []
    results = {}
    print(
        "| set | CV top-1 (95 % interval) | single split, test | fold models, test | final model, test | "
        "fold ensemble, test | test inside | kept as known: single, final | time vs k fits |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory(prefix="bench-crossval-") as folder:
        scratch = Path(folder)
        if args.quick:
            args.sets, args.folds, args.epochs = write_quick_sets(scratch / "sets")[:1], 2, 1
            args.extra = [
                "--model.backbone.name=resnet10t",
                "--model.backbone.pretrained=false",
                "--data.image_size=32",
                "--data.num_workers=0",
            ]
        elif not args.sets:
            parser.error("--sets is required (or --quick)")
        if args.weights_path:
            args.weights_path = args.weights_path.expanduser().resolve()
        for data in (path.expanduser().resolve() for path in args.sets):
            row = results[data.name] = one_set(args, data, scratch / data.name)
            low, high = row["cv_ci95"]
            inside = "/".join(
                "yes" if row[f"{name}_test_inside_interval"] else "no" for name in ("single_split", "final_model")
            )
            print(
                f"| {data.name} | {row['cv_top1']:.3f} ({low:.3f} to {high:.3f}) | "
                f"{row['single_split_test_top1']:.3f} | {row['fold_models_test_top1']:.3f} | "
                f"{row['final_model_test_top1']:.3f} ({row['final_model_epochs']} epochs) | "
                f"{row['fold_ensemble_test_top1']:.3f} | {inside} | "
                f"{row['single_split_test_in_domain']:.3f}, {row['final_model_test_in_domain']:.3f} | "
                f"{row['time_ratio']:.3f} |",
                flush=True,
            )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
