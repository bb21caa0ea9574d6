"""Sweeps through ``python sweep.py`` as a user runs them; the study is read back with Optuna's own ``load_study``.

Every trial is an ordinary run (its own directory, config, checkpoints); pruning goes through
optuna-integration's Lightning callback; workers share a study and survive being killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import torch
import yaml
from cifar_classifier.models import ImageClassifier
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState

from classifier_engine.commands import sweep as sweep_command_line  # sweep.py's, in this process
from classifier_engine.foundation.errors import UsageError
from classifier_engine.sweeps.space import SweepSpec
from classifier_engine.sweeps.study import without_password

from .conftest import (
    FAST_ARGS,
    PROJECT_ROOT,
    SLURM_ONE_TASK_JOB,
    cli_env,
    default_config,
    images_args,
    project_of,
    run_cli,
    slurm_stand_ins,
    write_image_folder,
    write_tiny_archive,
)

# The tests that start worker processes are marked slow; the quick tier parses sweep files and runs one
# trial in this process.
SLOW = pytest.mark.slow

TRIAL_OPTIONS = ["--config", str(default_config()), *FAST_ARGS, "--data.data_dir=data", "--trainer.max_epochs=2"]
SPACE = {
    "model.optimizer.init_args.lr": {"type": "float", "low": 0.01, "high": 0.3, "log": True},
    "model.label_smoothing": {"type": "categorical", "choices": [0.0, 0.1]},
}


def write_sweep(path: Path, pruner: str = "NopPruner", space: dict = SPACE, **changes: object) -> Path:
    spec = {"metric": "val/top1", "direction": "maximize", "sampler": {"class_path": "RandomSampler",
            "init_args": {"seed": 0}}, "pruner": {"class_path": pruner}, "space": space, **changes}  # fmt: skip
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"direction": "up"}, "direction: expected one of 'maximize', 'minimize', got up"),
        ({"sampler": {"class_path": "NoSuchSampler"}}, "sampler"),
        ({"pruner": {"class_path": "MedianPruner", "init_args": {"n_warmup": 2}}}, "n_warmup"),
        ({"pruner": {"class_path": "MedianPruner", "init_args": {"n_warmup_steps": -1}}}, "n_warmup_steps"),
        ({"trials": 3}, "trials"),
    ],
    ids=["direction", "unknown-sampler", "unknown-init-arg", "refused-value", "unknown-key"],
)
def test_the_sweep_file_is_parsed_like_every_config(tmp_path, changes, named):
    with pytest.raises(UsageError) as refused:
        SweepSpec.read(write_sweep(tmp_path / "sweep.yaml", **changes))
    assert named in str(refused.value) and "\n" not in str(refused.value)
    spec = SweepSpec.read(write_sweep(tmp_path / "good.yaml", pruner="MedianPruner"))
    assert isinstance(spec.make_sampler(), optuna.samplers.RandomSampler)
    assert spec.make_pruner() is not spec.make_pruner()  # a fresh one for each study


@pytest.mark.filterwarnings("ignore:The number of trials is too small to compute importances:UserWarning")
def test_one_trial_in_process_writes_its_run_the_study_and_the_best_config(tmp_path, monkeypatch, capsys):
    write_tiny_archive(tmp_path / "data")
    spec = write_sweep(tmp_path / "one.yaml")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["sweep.py"])
    assert (
        sweep_command_line.main(
            ImageClassifier, default_config(), ["--sweep", str(spec), "--n_trials", "1", *TRIAL_OPTIONS]
        )
        == 0
    )
    (trial,) = load(tmp_path, "one").trials
    assert trial.state == TrialState.COMPLETE and (tmp_path / trial.user_attrs["run_dir"] / "sweep.json").is_file()
    best = tmp_path / "runs" / "sweeps" / "one" / "best.yaml"
    assert yaml.safe_load(best.read_text())["model"]["label_smoothing"] == trial.params["model.label_smoothing"]
    assert f"Best config: {best.relative_to(tmp_path)}" in capsys.readouterr().out


def sweep_command(*args: str) -> list[str]:
    """``python sweep.py ARGS`` of the render its options belong to (``project_of``)."""
    return [sys.executable, str(project_of(args) / "sweep.py"), *args]


def sweep(*args: str, cwd: Path, check: bool = True, **env: str) -> subprocess.CompletedProcess:
    result = subprocess.run(sweep_command(*args), cwd=cwd, env=cli_env(**env), capture_output=True, text=True)
    if check:
        assert result.returncode == 0, result.stderr[-4000:]
    return result


def load(root: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{root / 'runs' / 'sweeps.db'}")


@SLOW
def test_a_sweep_trains_trials_as_runs_prunes_and_writes_the_best_config(tmp_path):
    write_tiny_archive(tmp_path / "data")
    spec = write_sweep(tmp_path / "lr.yaml", pruner="engine_probes.PruneLaterTrials")
    result = sweep("--sweep", str(spec), "--n_trials", "3", *TRIAL_OPTIONS, cwd=tmp_path)

    study = load(tmp_path, "lr")
    assert [trial.state for trial in study.trials] == [TrialState.COMPLETE, TrialState.PRUNED, TrialState.PRUNED]
    complete, *pruned = study.trials
    assert sorted(complete.intermediate_values) == [0, 1]  # one report per validation
    assert complete.value == complete.intermediate_values[1]
    run_dirs = [tmp_path / trial.user_attrs["run_dir"] for trial in study.trials]
    assert len(set(run_dirs)) == 3 and all((d / "config.yaml").is_file() for d in run_dirs)  # three ordinary runs
    config = yaml.safe_load((run_dirs[0] / "config.yaml").read_text())
    assert config["model"]["optimizer"]["init_args"]["lr"] == complete.params["model.optimizer.init_args.lr"]
    assert yaml.safe_load((run_dirs[0] / "sweep.json").read_text()) == {
        "study": "lr", "trial": 0, "state": "complete", "value": complete.value
    }  # fmt: skip
    for trial, run_dir in zip(pruned, run_dirs[1:], strict=True):
        assert sorted(trial.intermediate_values) == [0]  # stopped after its first validation
        assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["epoch"] == 0
        assert yaml.safe_load((run_dir / "sweep.json").read_text())["state"] == "pruned"
        assert f"Trial {trial.number} pruned by PruneLaterTrials: {run_dir.relative_to(tmp_path)}" in result.stdout

    best = tmp_path / "runs" / "sweeps" / "lr" / "best.yaml"
    assert f"Best config: {best.relative_to(tmp_path)}" in result.stdout
    assert (tmp_path / "runs" / "sweeps" / "lr" / "history.html").is_file()
    # best.yaml is exactly the best trial's config: the same run (already trained), resumed with nothing left.
    refused = run_cli("fit", "--config", str(best), cwd=tmp_path, check=False)
    assert refused.returncode == 2
    assert f"{run_dirs[0].relative_to(tmp_path)} already holds checkpoints" in refused.stderr
    resumed = run_cli("fit", "--config", str(best), "--ckpt_path=last", cwd=tmp_path)
    assert "Nothing left to train" in resumed.stdout

    shown = sweep("--sweep", str(spec), "--show", cwd=tmp_path)  # the table again, no trial
    assert "Study lr: 1 complete, 2 pruned" in shown.stdout and len(load(tmp_path, "lr").trials) == 3
    again = sweep("--sweep", str(spec), "--n_trials", "3", *TRIAL_OPTIONS, cwd=tmp_path)  # the count is reached
    assert "Trial " not in again.stdout and len(load(tmp_path, "lr").trials) == 3


@SLOW
def test_a_sweep_on_a_folder_of_images_packs_it_once_for_all_its_trials(tmp_path):
    write_image_folder(tmp_path / "photos", per_class=8)
    spec = write_sweep(tmp_path / "photos.yaml")
    result = sweep("--sweep", str(spec), "--n_trials", "2", *images_args("photos")[1:], cwd=tmp_path)
    assert [trial.state for trial in load(tmp_path, "photos").trials] == [TrialState.COMPLETE] * 2
    output = result.stdout + result.stderr
    assert output.count("Data: packed 24 images") == 1 and output.count("already packed") == 1
    configs = [yaml.safe_load(path.read_text()) for path in (tmp_path / "runs" / "images").glob("*/config.yaml")]
    assert len(configs) == 2 and all(config["data"]["init_args"]["image_dir"] == "photos" for config in configs)


@SLOW
def test_two_workers_share_a_study_and_never_run_the_same_trial(tmp_path):
    write_tiny_archive(tmp_path / "data")
    spec = write_sweep(tmp_path / "shared.yaml")
    command = sweep_command("--sweep", str(spec), "--n_trials", "4", *TRIAL_OPTIONS)
    (tmp_path / "runs").mkdir()
    load_or_create = optuna.create_study(  # created first, so that the two workers only join it
        study_name="shared", storage=f"sqlite:///{tmp_path / 'runs' / 'sweeps.db'}", direction="maximize"
    )
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    workers = [subprocess.Popen(command, cwd=tmp_path, env=cli_env(), **pipes) for _ in range(2)]
    outputs = [worker.communicate(timeout=600) for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0], outputs[0][1][-3000:] + outputs[1][1][-3000:]
    study = load(tmp_path, "shared")
    assert study.study_name == load_or_create.study_name
    finished = [trial for trial in study.trials if trial.state == TrialState.COMPLETE]
    assert len(finished) >= 4 and len(study.trials) <= 5  # at most one extra, started as the count was reached
    started = [[t.number for t in study.trials if f"Trial {t.number}:" in out] for out, _ in outputs]
    assert sorted(started[0] + started[1]) == [t.number for t in study.trials]  # each trial ran in one worker
    assert started[0] and started[1]  # both took part


@SLOW
@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")  # Optuna's retry bookkeeping
def test_a_killed_worker_leaves_no_trial_running_and_its_trial_resumes(tmp_path):
    write_tiny_archive(tmp_path / "data")
    spec = write_sweep(tmp_path / "preempted.yaml")
    probe = "--trainer.callbacks+=engine_probes.KillAt"
    args = ["--sweep", str(spec), "--n_trials", "2", "--heartbeat_interval", "1", "--grace_period", "2"]
    args += [*TRIAL_OPTIONS, probe]
    killed = sweep(*args, cwd=tmp_path, check=False, KILL_AT="train_batch:1:2")  # kill -9 in epoch 1 of trial 0
    assert killed.returncode == -9
    assert [trial.state for trial in load(tmp_path, "preempted").trials] == [TrialState.RUNNING]

    restarted = sweep(*args, cwd=tmp_path)  # the same command again, as a requeued job runs it
    study = load(tmp_path, "preempted")
    assert not [trial for trial in study.trials if trial.state == TrialState.RUNNING]
    assert [trial.state for trial in study.trials].count(TrialState.COMPLETE) == 2
    (retry,) = [trial for trial in study.trials if RetryHeartbeatStaleTrialCallback.retried_trial_number(trial) == 0]
    assert study.trials[0].state == TrialState.FAIL and retry.params == study.trials[0].params
    assert retry.user_attrs["run_dir"] == study.trials[0].user_attrs["run_dir"]  # the same config, the same run
    assert f"(resumed from {retry.user_attrs['run_dir']}/checkpoints/last.ckpt)" in restarted.stdout


@SLOW
def test_a_bad_sweep_file_is_one_line_before_any_trial(tmp_path):
    write_tiny_archive(tmp_path / "data")
    cases = {
        "unknown-key": ({"model.optimizer.init_args.lrr": {"type": "float", "low": 0.1, "high": 0.2}}, "lrr"),
        "low-above-high": ({"model.optimizer.init_args.lr": {"type": "float", "low": 0.2, "high": 0.1}}, "low"),
        "unknown-type": ({"model.label_smoothing": {"type": "normal", "low": 0.0, "high": 0.2}}, "type"),
        "bad-choice": ({"data.flip": {"type": "categorical", "choices": ["none", "sideways"]}}, "sideways"),
    }
    for name, (space, named) in cases.items():
        spec = write_sweep(tmp_path / f"{name}.yaml", space=space)
        result = sweep("--sweep", str(spec), "--n_trials", "2", *TRIAL_OPTIONS, cwd=tmp_path, check=False)
        assert result.returncode == 2, (name, result.stderr[-2000:])
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], (name, lines)
    assert not (tmp_path / "runs").exists()  # nothing was started, not even a study


@SLOW
@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_an_array_task_warned_by_slurm_requeues_itself_and_its_trial(tmp_path):
    bin_dir, submit_dir = slurm_stand_ins(tmp_path)
    write_tiny_archive(submit_dir / "data")
    spec = write_sweep(submit_dir / "array.yaml")
    probe = "--trainer.callbacks+=engine_probes.KillAt"
    task = {**SLURM_ONE_TASK_JOB, "SLURM_ARRAY_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": "0", "SWEEP": str(spec)}
    task |= {"SLURM_SUBMIT_DIR": str(submit_dir), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    task |= {"VIRTUAL_ENV": sys.prefix}
    command = ["bash", str(PROJECT_ROOT / "scripts" / "sweep_array.sbatch"), "--n_trials", "1", *TRIAL_OPTIONS, probe]

    def array_task(**env: str) -> subprocess.CompletedProcess:
        return subprocess.run(command, cwd=submit_dir, env=cli_env(**task, **env), capture_output=True, text=True)

    warned = array_task(KILL_AT="train_batch:1:2", KILL_SIGNAL="SIGUSR1")  # SLURM's warning, in epoch 1
    assert warned.returncode == 128 + signal.SIGUSR1, warned.stderr[-3000:]
    assert (submit_dir / "scontrol.log").read_text() == "scontrol requeue 77_0\n"  # the array task, requeued
    first, waiting = load(submit_dir, "array").trials
    assert (first.state, waiting.state) == (TrialState.FAIL, TrialState.WAITING)  # re-queued with its values

    requeued = array_task()  # the requeued task: the same script again
    assert requeued.returncode == 0, requeued.stderr[-3000:]
    retried = load(submit_dir, "array").trials[1]
    assert retried.state == TrialState.COMPLETE and retried.params == first.params
    assert retried.user_attrs["run_dir"] == first.user_attrs["run_dir"]
    assert f"(resumed from {first.user_attrs['run_dir']}/checkpoints/last.ckpt)" in requeued.stdout


def test_a_storage_url_is_printed_without_its_password():
    assert without_password("postgresql://ann:s3cr%40t@db.example:5432/studies") == (
        "postgresql://ann:***@db.example:5432/studies"
    )
    assert without_password("sqlite:///runs/sweeps.db") == "sqlite:///runs/sweeps.db"
    assert without_password("journal:runs/sweeps.journal") == "journal:runs/sweeps.journal"


@SLOW
def test_a_cross_validated_sweep_scores_each_trial_by_its_folds_mean_and_prunes_on_its_first_folds(tmp_path):
    write_tiny_archive(tmp_path / "data")
    spec = write_sweep(tmp_path / "folded.yaml", pruner="engine_probes.PruneLaterTrials")
    result = sweep("--sweep", str(spec), "--n_trials", "2", "--folds", "2", *TRIAL_OPTIONS, cwd=tmp_path)
    complete, pruned = load(tmp_path, "folded").trials
    assert (complete.state, pruned.state) == (TrialState.COMPLETE, TrialState.PRUNED)
    folds = complete.user_attrs["fold_values"]
    assert len(folds) == 2 and complete.value == pytest.approx(sum(folds) / 2)
    # one report per fold: the mean so far; the pruned trial stopped after its first fold
    assert complete.intermediate_values == pytest.approx({0: folds[0], 1: sum(folds) / 2})
    assert sorted(pruned.intermediate_values) == [0]
    assert "Trial 1 pruned by PruneLaterTrials after 1 of 2 folds" in result.stdout
    held_out = sorted((yaml.safe_load(path.read_text())["data"]["init_args"]["fold"], path.parent.name)
                      for path in (tmp_path / "runs").glob("*/*/config.yaml"))  # fmt: skip
    assert [fold for fold, _ in held_out] == [0, 0, 1]  # trial 0's two fold runs and trial 1's first
    refused = sweep("--sweep", str(spec), "--folds", "1", *TRIAL_OPTIONS, cwd=tmp_path, check=False)
    assert refused.returncode == 2 and "--folds must be 0" in refused.stderr.strip().splitlines()[-1]
