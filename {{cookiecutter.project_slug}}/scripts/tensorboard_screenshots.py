"""Screenshots of what TensorBoard shows for a run, taken in a real headless browser.

    python scripts/tensorboard_screenshots.py runs/{{ cookiecutter.dataset }}/<hash> [--out DIR] [--browser chromium]

Starts TensorBoard on the run (a free local port), opens its Time Series, Scalars, Images and
HPARAMS pages in headless Chromium (or Chrome) and saves ``<page>.png`` into ``DIR`` (default:
``<run>/screenshots/``). Exits 2 with a one-line message when no such browser is installed.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

PAGES = ("timeseries", "scalars", "images", "hparams")
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Headless, and quiet on a machine without internet access: no background or sync traffic.
BROWSER_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--window-size=1400,1000",
    "--virtual-time-budget=20000",  # let the page's scripts load and draw the data first
)


def find_browser(name: str | None = None) -> str | None:
    """The path of ``name``, or of the first Chromium-family browser installed."""
    for candidate in (name,) if name else BROWSERS:
        path = shutil.which(candidate)
        if path:
            return path
    return None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_serving(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def take_screenshots(run_dir: Path, out_dir: Path, browser: str) -> list[Path]:
    """Serve ``run_dir`` with TensorBoard and save one PNG per page into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    serve = ["--logdir", str(run_dir), "--host", "127.0.0.1", "--port", str(port)]
    server = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", *serve],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    shots = []
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until_serving(f"{base}/data/runs")
        with tempfile.TemporaryDirectory() as profile:
            for page in PAGES:
                shot = out_dir / f"{page}.png"
                subprocess.run(
                    [browser, *BROWSER_FLAGS, f"--user-data-dir={profile}", f"--screenshot={shot}", f"{base}/#{page}"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    timeout=120,
                    check=True,
                )
                shots.append(shot)
    finally:
        server.terminate()
        server.wait(timeout=30)
    return shots


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a run directory (or any folder of runs)")
    parser.add_argument("--out", type=Path, default=None, help="where the PNGs go (default: RUN_DIR/screenshots)")
    parser.add_argument("--browser", default=None, help="browser executable (default: the first Chromium found)")
    args = parser.parse_args()
    if not args.run_dir.is_dir():
        raise SystemExit(f"error: {args.run_dir} is not a folder; give a run directory such as runs/<name>/<hash>")
    browser = find_browser(args.browser)
    if browser is None:
        message = f"no headless browser found ({', '.join(BROWSERS)}); install Chromium, e.g. apt install chromium"
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)
    for shot in take_screenshots(args.run_dir, args.out or args.run_dir / "screenshots", browser):
        print(shot)


if __name__ == "__main__":
    main()
