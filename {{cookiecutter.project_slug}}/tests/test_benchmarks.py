"""The benchmark scripts run end to end (--quick); their figures are claims made elsewhere, not tested."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import PROJECT_ROOT, cli_env, write_tiny_archive

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
        ("bench_step.py", [], STEP_FIGURES),
        ("bench_step.py", ["--config", str(PROJECT_ROOT / "configs" / "cifar10_fast.yaml")], STEP_FIGURES),
        ("bench_step.py", ["--overhead"], STEP_FIGURES),
    ],
    ids=["data", "step", "step-fast-recipe", "step-overhead"],
)
def test_benchmark_prints_a_table_and_a_json_summary(tmp_path, script, options, keys):
    result = subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "benchmarks" / script), "--quick", "--device", "cpu", *options],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    *table, last = result.stdout.strip().splitlines()
    figures = json.loads(last)
    assert keys <= figures.keys() and all(figures[key] > 0 for key in keys)
    if script == "bench_step.py":  # the difference of the two loops' ms per step (noise may make it negative)
        assert figures["overhead_ms_per_step"] == figures["lightning_ms_per_step"] - figures["plain_ms_per_step"]
    assert any("images/s" in line for line in table)


def test_inference_benchmark_measures_every_runtime_at_both_batch_sizes(tmp_path):
    write_tiny_archive(tmp_path / "data")
    result = subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "benchmarks" / "bench_infer.py"), "--quick", "--data_dir", "data",
         "--model.backbone.width=8"],
        cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=600,
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
