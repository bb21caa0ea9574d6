"""The benchmark scripts run end to end (--quick); their figures are claims made elsewhere, not tested."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import PROJECT_ROOT, cli_env

pytestmark = pytest.mark.slow


STEP_FIGURES = {"lightning_images_per_s", "plain_images_per_s", "lightning_vs_plain"}


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
    ],
    ids=["data", "step", "step-fast-recipe"],
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
    assert any("images/s" in line for line in table)
