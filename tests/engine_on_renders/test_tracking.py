"""MLflow and W&B as stackable presets, read back with their own clients; TensorBoard callbacks without TensorBoard."""

from __future__ import annotations

import os

import mlflow
import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from .conftest import (
    PROJECT_ROOT,
    fit_args,
    images_args,
    only_run_dir,
    run_cli,
    write_image_folder,
    write_tiny_archive,
)

PRESETS = PROJECT_ROOT / "configs" / "presets"

pytestmark = [
    pytest.mark.slow,  # real fits; what they prove does not depend on the answers
    # mlflow 3.17's SQL store uses a SQLAlchemy 2.1 loader option that SQLAlchemy deprecates
    pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated"),
]


def test_the_mlflow_preset_tracks_the_run_beside_tensorboard(tmp_path):
    write_tiny_archive(tmp_path / "data")
    run_cli(*fit_args("data", "--config", str(PRESETS / "mlflow.yaml")), cwd=tmp_path)
    run_dir = only_run_dir(tmp_path)
    full_hash = (run_dir / "config_hash.txt").read_text().split()[0]

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    (run,) = mlflow.search_runs(experiment_names=["cifar-classifier"], output_format="list")
    assert run.info.run_name == run_dir.name  # named by the config hash
    assert run.data.params["config_hash"] == full_hash
    assert run.data.params["model/optimizer/class_path"] == "torch.optim.SGD"  # the whole config, flattened
    assert 0 <= run.data.metrics["val/top1"] <= 1 and "train/loss_step" in run.data.metrics
    artifacts = [item.path for item in mlflow.MlflowClient().list_artifacts(run.info.run_id)]
    assert artifacts == ["config.yaml"]
    assert (tmp_path / "runs" / "mlartifacts").is_dir() and not (tmp_path / "mlruns").exists()
    events = EventAccumulator(str(run_dir))  # TensorBoard is still there, with everything
    events.Reload()
    assert "val/top1" in events.Tags()["scalars"] and events.Tags()["histograms"]
    # The tracker is not part of the run's identity: the same config without it is the same run.
    again = run_cli(*fit_args("data"), cwd=tmp_path, check=False)
    assert again.returncode == 2 and "already holds checkpoints" in again.stderr


def test_the_mlflow_preset_tracks_a_run_on_a_folder_of_images(tmp_path):
    write_image_folder(tmp_path / "photos", per_class=8)
    run_cli(*images_args("photos", "--config", str(PRESETS / "mlflow.yaml")), cwd=tmp_path)
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    (run,) = mlflow.search_runs(experiment_names=["cifar-classifier"], output_format="list")
    assert run.info.run_name == only_run_dir(tmp_path).name and 0 <= run.data.metrics["val/top1"] <= 1
    assert run.data.params["data/init_args/image_size"] == "32"


def test_the_wandb_preset_writes_an_offline_run_into_the_run_directory(tmp_path):
    write_tiny_archive(tmp_path / "data")
    quiet = {"WANDB_SILENT": "true"}
    result = run_cli(*fit_args("data", "--config", str(PRESETS / "wandb.yaml")), cwd=tmp_path, env=quiet)
    run_dir = only_run_dir(tmp_path)
    (offline,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")  # what `wandb sync` uploads
    recorded = offline.read_bytes()
    assert (run_dir / "config_hash.txt").read_text().split()[0].encode() in recorded  # the hash ...
    assert b"data_fingerprint" in recorded and b"val/top1" in recorded  # ... the whole config and the metrics
    assert "Run: " in result.stdout


def test_tensorboard_callbacks_skip_with_one_notice_when_only_another_tracker_logs(tmp_path):
    write_tiny_archive(tmp_path / "data")
    only_mlflow = tmp_path / "only_mlflow.yaml"
    logger = yaml.safe_load((PRESETS / "mlflow.yaml").read_text())["trainer"]["logger+"][0]
    only_mlflow.write_text(yaml.safe_dump({"trainer": {"logger": logger}}))
    result = run_cli(*fit_args("data", "--config", str(only_mlflow)), cwd=tmp_path)
    notices = [line.split("UserWarning: ")[1] for line in result.stderr.splitlines() if "UserWarning: " in line]
    notices = [notice for notice in notices if "no TensorBoardLogger attached" in notice]
    assert notices and len(notices) == len(set(notices))  # one per callback, not one per step
    (checkpoint,) = tmp_path.glob("runs/*/checkpoints/last.ckpt")  # in runs/<hash>/, as always without TensorBoard
    assert (checkpoint.parents[1] / "config.yaml").is_file()
    resumed = run_cli(*fit_args("data", "--config", str(only_mlflow), "--ckpt_path=last"), cwd=tmp_path)
    assert "Nothing left to train" in resumed.stdout


# Installed as sitecustomize.py: makes the modules named in BLOCKED_MODULES look not installed.
BLOCKER = """
import os, sys

class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in os.environ["BLOCKED_MODULES"].split(","):
            raise ModuleNotFoundError("No module named " + repr(name), name=name)

sys.meta_path.insert(0, _NotInstalled())
"""


@pytest.mark.parametrize(("preset", "module"), [("mlflow.yaml", "mlflow"), ("wandb.yaml", "wandb")])
def test_a_preset_without_its_extra_is_one_line_naming_the_install(tmp_path, preset, module):
    write_tiny_archive(tmp_path / "data")
    (tmp_path / "blocker").mkdir()
    (tmp_path / "blocker" / "sitecustomize.py").write_text(BLOCKER)
    env = {"BLOCKED_MODULES": module, "PYTHONPATH": f"{tmp_path / 'blocker'}{os.pathsep}{os.environ['PYTHONPATH']}"}
    result = run_cli(*fit_args("data", "--config", str(PRESETS / preset)), cwd=tmp_path, check=False, env=env)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].endswith(f"is not installed; pip install -e '.[{module}]'")
    assert [line for line in result.stderr.splitlines() if line.startswith("error: ")] == [
        result.stderr.strip().splitlines()[-1]
    ]
    assert not (tmp_path / "runs").exists()  # nothing left behind
