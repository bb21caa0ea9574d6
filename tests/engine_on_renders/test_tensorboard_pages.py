"""What a person sees in TensorBoard: the run's pages rendered in a real headless browser, saved as PNGs."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from PIL import Image

from .conftest import PROJECT_ROOT, fit_args, only_run_dir, run_cli, write_tiny_archive

SCRIPT = PROJECT_ROOT / "scripts" / "tensorboard_screenshots.py"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


@pytest.mark.slow  # a training run, a TensorBoard server and a browser
@pytest.mark.skipif(
    not any(shutil.which(name) for name in BROWSERS),
    reason="no headless Chromium or Chrome installed (e.g. apt install chromium) to render TensorBoard's pages",
)
@pytest.mark.filterwarnings("ignore:.*does not have many workers.*:UserWarning")
def test_tensorboard_pages_are_rendered_for_a_reviewer(tmp_path):
    write_tiny_archive(tmp_path / "data")
    run_cli(*fit_args("data", "--trainer.max_epochs=2"), cwd=tmp_path)
    run_dir = only_run_dir(tmp_path)
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(run_dir)], capture_output=True, text=True, timeout=600, check=True
    )
    shots = [run_dir / "screenshots" / f"{page}.png" for page in ("timeseries", "scalars", "images", "hparams")]
    assert result.stdout.split() == [str(shot) for shot in shots]
    for shot in shots:
        with Image.open(shot) as image:
            assert image.size == (1400, 1000)
            # A drawn page has charts, images and text: many colours, not a blank or error page.
            assert len(image.convert("RGB").getcolors(maxcolors=1 << 20)) > 200, shot


def test_the_script_says_what_is_missing(tmp_path):
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "nosuch")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0 and result.stderr.startswith("error: ") and "Traceback" not in result.stderr
