"""The benchmark scripts run end to end (--quick); their figures are claims made elsewhere, not tested."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys

import pytest

from classifier_engine.data.cifar_format import CIFAR10
from classifier_engine.testing.cifar_archives import write_archive

from .conftest import NUM_TRAIN, PHOTO_ROOT, PROJECT_ROOT, cli_env, make_images, write_tiny_archive

# The project each benchmark measures (run from elsewhere, it is named by BENCH_PROJECT): photos or CIFAR.
PHOTO_BENCHMARKS = {
    "bench_folder.py",
    "bench_stream.py",
    "bench_finetune.py",
    "bench_unknown.py",
    "bench_crossval.py",
    "bench_layout.py",
}


def bench_command(script: str) -> list[str]:
    """``python -m classifier_engine.bench NAME``: the benchmark as the installed library runs it."""
    return [sys.executable, "-m", "classifier_engine.bench", script.removeprefix("bench_").removesuffix(".py")]


def bench_env(script: str, **extra: str) -> dict[str, str]:
    return cli_env(BENCH_PROJECT=str(PHOTO_ROOT if script in PHOTO_BENCHMARKS else PROJECT_ROOT), **extra)


pytestmark = pytest.mark.slow


STEP_FIGURES = {"lightning_images_per_s", "plain_images_per_s", "lightning_vs_plain", "lightning_ms_per_step"}


@pytest.mark.parametrize(
    ("script", "options", "keys"),
    [
        (
            "bench_data.py",
            [],
            {
                "ours_uint8_w2",
                "ours_resident_augmented",
                "torchvision_augmented_w2",
                "augmented_vs_torchvision",
                "resident_uint8_vs_torchvision",
                "ours_peak_rss_mb_w2",
            },
        ),
        (
            "bench_folder.py",
            [],
            {"pack_images_per_s_64", "ours_augmented_64", "torchvision_imagefolder_64", "ours_vs_imagefolder_64"},
        ),
        (
            "bench_stream.py",
            [],
            {"s3_first_epoch_64", "s3_cached_64", "litdata_local_64", "memmap_64", "imagefolder_64"},
        ),
        ("bench_step.py", [], STEP_FIGURES),
        ("bench_step.py", ["--config", str(PROJECT_ROOT / "configs" / "cifar10_fast.yaml")], STEP_FIGURES),
        ("bench_step.py", ["--overhead"], STEP_FIGURES),
        (
            "bench_layout.py",
            [],
            {"train_nchw_images_per_s", "train_nhwc_images_per_s", "train_ratio", "evaluate_ratio"},
        ),
    ],
    ids=["data", "folder", "stream", "step", "step-fast-recipe", "step-overhead", "layout"],
)
def test_benchmark_prints_a_table_and_a_json_summary(tmp_path, script, options, keys):
    result = subprocess.run(
        [*bench_command(script), "--quick", "--device", "cpu", *options],
        cwd=tmp_path,
        env=bench_env(script),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    *table, last = result.stdout.strip().splitlines()
    figures = json.loads(last)
    assert keys <= figures.keys() and all(figures[key] > 0 for key in keys)
    if script == "bench_step.py":  # the two loops' difference in ms per step, per round (noise may make it negative)
        assert figures["overhead_ms_per_step"] == statistics.median(figures["overhead_ms_per_round"])
    assert any("images/s" in line for line in table)


def test_the_finetune_benchmark_runs_the_default_its_probe_the_plain_recipe_and_script_and_compares_them(tmp_path):
    result = subprocess.run(
        [*bench_command("bench_finetune.py"), "--quick", "--device", "cpu"],
        cwd=tmp_path, env=bench_env("bench_finetune.py", HF_HUB_OFFLINE="1"), capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    *table, last = result.stdout.strip().splitlines()
    figures = json.loads(last)
    rows = [[cell.strip() for cell in line.split("|")[1:5]] for line in table[2:]]
    assert [arm for arm, *_ in rows] == ["default", "probe", "plain", "script"]  # fastai: only with --fastai_python
    for arm, _, top1, seconds in rows:
        assert figures[f"{arm}_top1"] == pytest.approx(float(top1.rstrip(" %")) / 100, abs=5e-5)
        assert figures[f"{arm}_cpu_seconds"] == pytest.approx(float(seconds), abs=0.5) and float(seconds) > 0
        assert figures[f"{arm}_top1_sd"] == 0.0  # one seed
    for other in ("probe", "script"):
        lead = 100 * (figures["default_top1"] - figures[f"{other}_top1"])
        assert figures[f"default_minus_{other}_points"] == pytest.approx(lead)
    assert list(tmp_path.iterdir()) == []  # its runs went to a temporary folder


def test_the_unknown_benchmark_scores_in_domain_far_and_near_photos_and_the_mosaics(tmp_path):
    result = subprocess.run(
        [*bench_command("bench_unknown.py"), "--quick", "--mosaics"],
        cwd=tmp_path, env=bench_env("bench_unknown.py", HF_HUB_OFFLINE="1"), capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    *table, last = result.stdout.strip().splitlines()
    figures = json.loads(last)
    assert {"warm/far", "warm/near", "cool/far", "cool/near", "mosaics", "predict_cost_ratio"} <= figures.keys()
    for score in ("knn", "mahalanobis", "vim", "energy", "msp"):
        row = figures["warm/far"][score]
        assert 0 <= row["auroc"] <= 1 and 0 <= row["fpr95"] <= 1 and 0 <= row["unknown"] <= 1
    rows = [line for line in table if line.startswith("| warm | far | 0 |")]
    assert len(rows) == 5 and figures["predict_cost_ratio"] > 0
    assert figures["mosaics"]["count_matched_given_per_image"] > 0 and figures["mosaics"]["true_per_image"] > 1
    assert list(tmp_path.iterdir()) == []  # its runs went to a temporary folder


def test_inference_benchmark_measures_every_runtime_at_both_batch_sizes(tmp_path):
    write_tiny_archive(tmp_path / "data")
    result = subprocess.run(
        [*bench_command("bench_infer.py"), "--quick", "--data_dir", "data",
         "--model.backbone.width=8"],
        cwd=tmp_path, env=bench_env("bench_infer.py"), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    *table, last = result.stdout.strip().splitlines()
    figures = json.loads(last)
    for runtime in ("eager", "onnx_fp32", "onnx_int8"):
        for batch in (1, 256):
            assert figures[f"{runtime}_b{batch}_images_per_s"] > 0
            assert 0 < figures[f"{runtime}_b{batch}_p50_ms"] <= figures[f"{runtime}_b{batch}_p99_ms"]
    assert figures["eager_vs_eager_b1"] == 1.0 and isinstance(figures["vnni"], bool)
    assert any("onnx_int8" in line for line in table)


# Shaped like airbench94.py where bench_recipe.py touches it: it reads cifar10/train.pt and test.pt,
# hard-codes .cuda(), .half(), torch.cuda.Event and torch.cuda.synchronize, keeps its settings in
# `hyp`, reports through print_training_details and returns the TTA accuracy from main(run). It
# classifies by the nearest class mean, so it runs in a moment; the real file is the user's.
AIRBENCH_SHAPED = """
import os
import torch

hyp = {"opt": {"batch_size": 1024, "train_epochs": 9.9}, "net": {"widths": {"block1": 64}}}

def print_training_details(variables, is_final_entry):
    print(variables.get("epoch"), variables.get("total_time_seconds"))

def load(name):
    data = torch.load(os.path.join("cifar10", name), map_location=torch.device(gpu))
    images, labels = data["images"], data["labels"]
    assert images.dtype == torch.uint8 and images.shape[1:] == (32, 32, 3), images.shape  # NHWC, as airbench's
    return (images.half() / 255).permute(0, 3, 1, 2).flatten(1).float(), labels

gpu = 0

def main(run):
    with open(os.environ["AIRBENCH_CALLS"], "a") as calls:  # the epochs each run was asked for
        calls.write(f"{hyp['opt']['train_epochs']}\\n")
    starter, ender = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    starter.record()
    (train_x, train_y), (test_x, test_y) = load("train.pt"), load("test.pt")
    means = torch.stack([train_x[train_y == k].mean(0) for k in range(10)]).cuda()
    tta_val_acc = (torch.cdist(test_x, means).argmin(1) == test_y).float().mean().item()
    ender.record()
    torch.cuda.synchronize()
    total_time_seconds = 1e-3 * starter.elapsed_time(ender)
    epoch = "eval"
    print_training_details(locals(), is_final_entry=True)
    return tta_val_acc
"""


@pytest.mark.parametrize("per_epoch_validation", [False, True], ids=["final-validation-only", "per-epoch-validation"])
def test_recipe_benchmark_times_the_recipe_beside_an_airbench_shaped_reference(tmp_path, per_epoch_validation):
    if per_epoch_validation:  # --quick is a smoke test on the data users have: epochs far longer than its 8 steps
        train, test = make_images(2000, 10, seed=0), make_images(64, 10, seed=1)
        write_archive(tmp_path / "data" / CIFAR10.archive_name, CIFAR10, *train, *test)
    else:
        write_tiny_archive(tmp_path / "data")
    (tmp_path / "airbench94.py").write_text(AIRBENCH_SHAPED)
    (tmp_path / "configs").mkdir()  # given as a relative path, as the README writes it (each run works elsewhere)
    shutil.copy(PROJECT_ROOT / "configs" / "cifar10_fast.yaml", tmp_path / "configs")
    options = ["--per_epoch_validation"] if per_epoch_validation else ["--reference", "airbench94.py"]
    result = subprocess.run(
        [*bench_command("bench_recipe.py"), "--quick", "--device", "cpu",
         "--config", "configs/cifar10_fast.yaml", "--seeds", "2", "--data_dir", "data",
         "--data.verify_checksum=false", *options],
        cwd=tmp_path, env=bench_env("bench_recipe.py", AIRBENCH_CALLS=str(tmp_path / "calls.txt")),
        capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["seeds"] == 2 and 0 <= figures["project_top1"] <= 1 and figures["project_s"] > 0
    assert 0 < figures["project_final_eval_s"] < figures["project_s"]
    if per_epoch_validation:  # epoch 0's validation is timed on its own, not counted
        assert figures["project_per_epoch_eval_s"] > 0 and "airbench94_s" not in figures
        return
    assert figures["project_per_epoch_eval_s"] == 0  # only the final weights were validated
    assert "map_location=torch.device(gpu) -> map_location='cpu'" in result.stdout  # the CPU adaptation is named
    assert "torch.cuda.Event(enable_timing=True) -> _HostEvent()" in result.stdout
    assert 0 <= figures["airbench94_top1"] <= 1 and figures["airbench94_s"] > 0
    # a warm-up as short as the project's (2 steps of 32 images), then the full runs
    calls = [float(line) for line in (tmp_path / "calls.txt").read_text().split()]
    assert calls == [pytest.approx(2 * 32 / NUM_TRAIN), 1.4, 1.4]
    assert figures["time_vs_airbench94"] == figures["project_s"] / figures["airbench94_s"]
    assert figures["top1_minus_airbench94"] == figures["project_top1"] - figures["airbench94_top1"]


def test_recipe_benchmark_refuses_a_missing_reference_in_one_line(tmp_path):
    result = subprocess.run(
        [*bench_command("bench_recipe.py"), "--quick", "--reference", "nope.py"],
        cwd=tmp_path, env=bench_env("bench_recipe.py"), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2 and result.stderr.startswith("error: --reference nope.py: no such file")
    assert len(result.stderr.strip().splitlines()) == 1 and not list(tmp_path.iterdir())


def test_the_cross_validation_benchmark_sets_its_estimate_against_a_held_out_split_and_times_k_fits(tmp_path):
    result = subprocess.run(
        [*bench_command("bench_crossval.py"), "--quick"],
        cwd=tmp_path, env=bench_env("bench_crossval.py", HF_HUB_OFFLINE="1"), capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    *table, last = result.stdout.strip().splitlines()
    row = json.loads(last)["warm"]
    low, high = row["cv_ci95"]
    assert low <= row["cv_top1"] <= high and 0 <= row["single_split_test_top1"] <= 1
    assert row["single_split_test_inside_interval"] == (low <= row["single_split_test_top1"] <= high)
    assert row["final_model_test_inside_interval"] == (low <= row["final_model_test_top1"] <= high)
    assert row["final_model_epochs"] >= 1 and row["final_model_seconds"] > 0 and row["seed"] == 0
    assert 0 <= row["fold_ensemble_test_top1"] <= 1
    assert all(0 <= row[f"{name}_test_in_domain"] <= 1 for name in ("single_split", "final_model"))
    for name in ("single_split", "final_model"):  # the test split's own interval holds its figure
        test_low, test_high = row[f"{name}_test_ci95"]
        assert 0 <= test_low <= row[f"{name}_test_top1"] <= test_high <= 1 and test_high - test_low > 0
        assert row[f"cv_inside_{name}_test_ci95"] == (test_low <= row["cv_top1"] <= test_high)
    gained = row["only_final_model_right"] - row["only_single_split_right"]
    assert gained == round((row["final_model_test_top1"] - row["single_split_test_top1"]) * row["test_images"])
    assert 0 < row["final_vs_single_mcnemar_p"] <= 1
    assert row["time_ratio"] == pytest.approx(row["cv_seconds"] / row["separate_fits_seconds"])
    for mode, whole in (("cv", "cv_seconds"), ("separate", "separate_fits_seconds")):  # each fold's fit, within
        fits = row[f"{mode}_fold_fit_seconds"]
        assert len(fits) == 2 and all(seconds > 0 for seconds in fits) and sum(fits) < row[whole]
    assert table[-1].startswith("| warm | ") and list(tmp_path.iterdir()) == []
