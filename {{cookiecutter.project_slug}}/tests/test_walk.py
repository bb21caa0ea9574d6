"""One walk through the README's commands on a tiny generated set, each typed as a user types it.

fit, a SIGTERM in the middle of the second epoch, ``--ckpt_path last`` to finish, test with its report,
predict and export: the project's own model and DataModule through classifier_engine's command line.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import DEFAULT_CONFIG, PROJECT_ROOT, TINY_ARGS, run_command, write_data


def stop_in_epoch(command: list[str], cwd: Path, epoch: int) -> subprocess.CompletedProcess:
    """Start ``command`` and send SIGTERM once its run has written a checkpoint of ``epoch`` (as a scheduler would)."""
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        if any(cwd.glob(f"runs/*/*/checkpoints/epoch={epoch - 1}*.ckpt")) or any(
            cwd.glob("runs/*/*/checkpoints/last.ckpt")
        ):
            process.send_signal(signal.SIGTERM)
            break
        time.sleep(0.05)
    stdout, stderr = process.communicate(timeout=300)
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_fit_stop_resume_test_predict_and_export(tmp_path):
    data = write_data(tmp_path)
    fit = ["fit", "--config", str(DEFAULT_CONFIG), *TINY_ARGS, *data, "--trainer.max_epochs=3"]
    stopped = stop_in_epoch([sys.executable, str(PROJECT_ROOT / "main.py"), *fit], tmp_path, epoch=1)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    (run_dir,) = [path.parent for path in tmp_path.glob("runs/*/*/config.yaml")]
    last = run_dir / "checkpoints" / "last.ckpt"
    assert last.is_file() and "last.ckpt" in stopped.stdout + stopped.stderr

    resumed = run_command("main.py", *fit, "--ckpt_path=last", cwd=tmp_path)
    assert "`Trainer.fit` stopped: `max_epochs=3` reached." in resumed.stdout + resumed.stderr
    assert [path.parent for path in tmp_path.glob("runs/*/*/config.yaml")] == [run_dir]  # the same run, continued

    evaluation = ["--config", str(DEFAULT_CONFIG), *TINY_ARGS, *data, "--ckpt_path", str(last)]
    tested = run_command("main.py", "test", *evaluation, cwd=tmp_path)
    assert "test/top1" in tested.stdout + tested.stderr
    assert list(run_dir.rglob("report.html")), sorted(str(path) for path in run_dir.rglob("*"))[:40]

    run_command("main.py", "predict", *evaluation, cwd=tmp_path)
    assert list(run_dir.rglob("predictions*.csv"))

    # The run's own config builds the model and finds its data: a checkpoint names no folder an export follows.
    shipping = ["--config", str(run_dir / "config.yaml"), "--max_int8_drop", "100", "--tolerance", "0.05"]
    run_command("export.py", "--ckpt_path", str(last), *shipping, cwd=tmp_path)
    card = json.loads((last.parent / "export" / "model.card.json").read_text())
    assert sorted(card["artifacts"]) == ["int8", "onnx", "pt2"] and card["evaluation"]["images"] > 0
    assert card["source"]["config_hash"].startswith(run_dir.name)
