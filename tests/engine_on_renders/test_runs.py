"""Runs as a user meets them, through real ``python main.py`` processes: where they go, how they end, and mistakes.

Every bad input gets one ``error:`` line naming the knob, the right exit code, no traceback,
and leaves every file under the working folder byte for byte as it was.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from classifier_engine.data.cifar_format import CIFAR10

from .conftest import (
    DATASET,
    FAST_ARGS,
    PROJECT_ROOT,
    cli_env,
    default_config,
    fit_args,
    only_run_dir,
    project_of,
    run_cli,
    tree,
    write_tiny_archive,
)

pytestmark = [
    pytest.mark.slow,  # some forty real training and refused processes, the same for every answer
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*:UserWarning"),
]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """A folder with data and one finished 1-epoch run, and that fit's process."""
    root = tmp_path_factory.mktemp("finished")
    write_tiny_archive(root / "data")
    write_tiny_archive(root / "other_data", seed=7)  # another archive, as one's own data would be
    (root / "bad_data").mkdir()
    (root / "bad_data" / DATASET.archive_name).write_bytes(b"not a tar archive at all" * 100)
    (root / "garbage.ckpt").write_bytes(b"\x80\x04garbage" * 50)
    torch.save({"weights": torch.zeros(2)}, root / "foreign.ckpt")
    (root / "a_file").write_text("a file where a folder is expected")
    fitted = run_cli(*fit_args("data"), cwd=root)
    last = (only_run_dir(root) / "checkpoints" / "last.ckpt").read_bytes()
    (root / "truncated.ckpt").write_bytes(last[: len(last) // 2])  # as a full disk or a kill leaves a plain copy
    flipped = bytearray(last)
    flipped[len(last) // 2] ^= 0x10  # one bit of a weight, as a failing disk changes it: torch.load would not notice
    (root / "flipped.ckpt").write_bytes(bytes(flipped))
    return root, fitted


def test_a_finished_fit_says_where_everything_went(finished):
    root, fitted = finished
    run_dir = only_run_dir(root)
    lines = {line.split(":", 1)[0]: line for line in fitted.stdout.splitlines() if ":" in line}
    assert lines["Run"] == f"Run: {run_dir.relative_to(root)}"
    assert f"{run_dir.relative_to(root)}/checkpoints/best-epoch=000.ckpt (val/top1 " in lines["Best checkpoint"]
    assert "at epoch 0)" in lines["Best checkpoint"]
    assert f"{run_dir.relative_to(root)}/checkpoints/last.ckpt (step 10)" in lines["Last checkpoint"]
    assert "val/top1 " in lines["Final metrics"] and "train/loss " in lines["Final metrics"]
    assert "for 10 steps this session" in lines["Time"] and "images/s" in lines["Time"]
    classes = f"{len(DATASET.class_names)} classes at 32 px ({DATASET.title})"
    assert lines["Data"] == f"Data: 160 training and 32 validation images of {classes}"
    assert "Note" not in lines  # data.val_size > 0: validation is on held-out training images
    assert "LeafSpec" not in fitted.stderr and "💡" not in fitted.stderr  # known upstream noise is muted


# (id, extra arguments, exit code, what the message must name)
BAD_INPUTS = [
    ("same-config-again", [], 2, "--ckpt_path last"),
    ("changed-config", ["--ckpt_path=last", "--trainer.max_epochs=2"], 2, "trainer.max_epochs: 1 -> 2"),
    ("other-data", ["--ckpt_path=last", "--data.data_dir=other_data"], 2, "data_fingerprint"),
    (
        "weights-do-not-fit",
        ["--ckpt_path=last", "--model.backbone.width=8", "--allow_config_change=true"],
        2,
        "model.backbone.init_args.width: 4 -> 8",
    ),
    ("no-run-to-resume", ["--ckpt_path=last", "--trainer.logger.init_args.name=other"], 2, "--allow_fresh_start"),
    ("missing-checkpoint", ["--ckpt_path=nosuch.ckpt"], 2, "--ckpt_path nosuch.ckpt"),
    ("garbage-checkpoint", ["--ckpt_path=garbage.ckpt"], 1, "garbage.ckpt"),
    ("foreign-checkpoint", ["--ckpt_path=foreign.ckpt"], 1, "foreign.ckpt"),
    ("truncated-checkpoint", ["--ckpt_path=truncated.ckpt"], 1, "truncated.ckpt is not a readable checkpoint"),
    ("bit-flipped-checkpoint", ["--ckpt_path=flipped.ckpt"], 1, "fails its checksum"),
    ("missing-data-folder", ["--data.data_dir=nosuch", "--data.download=false"], 1, "data.data_dir"),
    ("damaged-archive", ["--data.data_dir=bad_data", "--trainer.logger.init_args.name=bad"], 1, "bad_data"),
    ("val-size-too-large", ["--data.val_size=100000", "--trainer.max_epochs=2"], 2, "data.val_size"),
    (
        "global-batch-indivisible",
        ["--data.global_batch_size=33", "--trainer.accumulate_grad_batches=2", "--trainer.max_epochs=2"],
        2,
        "data.global_batch_size=33 does not divide",
    ),
    ("bad-value", ["--model.lr_schedule.warmup_fraction=2"], 2, "model.lr_schedule.warmup_fraction"),
    ("network-without-num-classes", ["--model.backbone=torch.nn.Identity"], 2, "model.backbone Identity("),
    ("output-not-a-folder", ["--trainer.logger.init_args.save_dir=a_file/runs"], 1, "save_dir"),
    # What resume rests on cannot be listed again, replaced or switched off (cli/guarantees.py).
    (
        "installed-callback-listed",
        ["--trainer.callbacks+=classifier_engine.checkpoints.random_state.RandomState"],
        2,
        "RandomState is installed by the project",
    ),
    ("checkpoint-writer-replaced", ["--trainer.plugins=lightning.pytorch.plugins.TorchCheckpointIO"], 2, "plugins"),
    (
        "own-last-ckpt-writer",
        ['--trainer.callbacks+={"class_path": "ModelCheckpoint", "init_args": {"save_last": true}}'],
        2,
        "last.ckpt",
    ),
    ("checkpointing-off", ["--trainer.enable_checkpointing=false"], 2, "trainer.enable_checkpointing"),
    ("bad-requeue-signal", ["--safety.requeue_signal=SIGKILL", "--trainer.max_epochs=2"], 2, "safety.requeue_signal"),
    (
        "extension-failing-before-its-first-step",
        ["--ckpt_path=last", "--trainer.max_epochs=2", "--allow_config_change=true", "--data.val_size=100000"],
        2,
        "data.val_size",
    ),
]


@pytest.mark.every_render
@pytest.mark.parametrize(("extra", "code", "named"), [case[1:] for case in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS])
def test_a_mistake_gets_one_line_and_changes_nothing_on_disk(finished, extra, code, named):
    root, _ = finished
    before = tree(root)
    result = run_cli(*fit_args("data"), *extra, cwd=root, check=False)
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode == code, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and len(error_lines) == 1, result.stderr[-3000:]
    assert named in error_lines[0] and "; " in error_lines[0]  # what was wrong; what to do
    assert tree(root) == before


def test_the_traceback_is_one_switch_away(finished):
    root, _ = finished
    result = run_cli(*fit_args("data"), "--ckpt_path=nosuch.ckpt", cwd=root, check=False, env={"FULL_ERROR": "1"})
    assert result.returncode != 0 and "Traceback" in result.stderr and "UsageError" in result.stderr


def test_evaluating_last_finds_the_run_and_says_where_it_logged(finished):
    root, _ = finished
    run_dir = only_run_dir(root)
    test = ["test", "--config", str(default_config()), *FAST_ARGS, "--data.data_dir=data", "--ckpt_path=last"]
    tested = run_cli(*test, cwd=root)
    (logged,) = run_dir.glob("test/*/events.*")
    checkpoint, log_dir = run_dir.relative_to(root) / "checkpoints" / "last.ckpt", logged.parent.relative_to(root)
    assert f"Test of {checkpoint} logged to {log_dir}" in tested.stdout
    assert "dirpath has changed" not in tested.stderr


def test_default_root_dir_holds_the_runs_and_a_bare_command_uses_the_default_config(tmp_path):
    default = PROJECT_ROOT / "configs" / "cifar10.yaml"  # what main.py starts from
    write_tiny_archive(tmp_path / "data")
    options = [*FAST_ARGS, "--data.data_dir=data"]
    run_cli("fit", "--config", str(default), *options, "--trainer.default_root_dir=elsewhere", cwd=tmp_path)
    (under_root,) = tmp_path.glob("elsewhere/runs/*/*/checkpoints/last.ckpt")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "lightning_logs").exists()
    run_cli("fit", *options, cwd=tmp_path)  # no --config at all
    (bare,) = tmp_path.glob("runs/*/*/checkpoints/last.ckpt")
    assert bare.parents[2].name == under_root.parents[2].name  # the default config's logger name
    assert bare.parent.parent.name == under_root.parent.parent.name  # the same config: the same run name


def test_a_job_script_may_start_fresh_or_resume_with_one_command(tmp_path):
    write_tiny_archive(tmp_path / "data")
    command = fit_args("data", "--ckpt_path=last", "--allow_fresh_start=true")
    run_cli(*command, cwd=tmp_path)
    again = run_cli(*command, cwd=tmp_path)
    assert "(resumed from" in again.stdout and "Nothing left to train" in again.stdout
    assert torch.load(only_run_dir(tmp_path) / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 10
    # The same run typed by hand, without the job script's launch switch: the same run directory, resumed.
    by_hand = run_cli(*fit_args("data", "--ckpt_path=last"), cwd=tmp_path)
    assert "(resumed from" in by_hand.stdout and "Nothing left to train" in by_hand.stdout
    assert f"Run: {only_run_dir(tmp_path).relative_to(tmp_path)} (resumed from" in by_hand.stdout  # still one run


def scalars(run_dir: Path, prefix: str) -> dict[str, dict[int, float]]:
    """Every ``prefix*`` scalar of the run's own event files (not of evaluations logged inside it), by step."""
    values: dict[str, dict[int, float]] = {}
    for events_file in sorted(run_dir.glob("events.out.tfevents.*")):
        events = EventAccumulator(str(events_file), size_guidance={"scalars": 0})
        events.Reload()
        for tag in events.Tags()["scalars"]:
            if tag.startswith(prefix):
                values.setdefault(tag, {}).update({event.step: event.value for event in events.Scalars(tag)})
    return values


# The fast recipe (a CIFAR-10 recipe whatever the default dataset), small and in fp32 on the CPU.
FAST = ["--config", str(default_config()), "--config", "configs/cifar10_fast.yaml", "--data.global_batch_size=32"]
FAST += ["--model.backbone.width=8"]
FAST += ["--trainer.precision=32-true"]
# (Constant has nothing to stretch; OneCycle, the default, is extended under the debug preset.)
EXTENSIONS = [
    pytest.param("photo_classifier.models.schedules.WarmupCosine", [], id="warmup_cosine"),  # the photo render's
    pytest.param("Triangle", [], id="triangle"),
    pytest.param(
        "OneCycle", ["--config", "configs/presets/debug.yaml", "--trainer.limit_train_batches=6"], id="debug-preset"
    ),
    pytest.param("Triangle", ["--config", "configs/presets/early_stopping.yaml"], id="early-stopping-preset"),
]


@pytest.mark.parametrize(("schedule", "stack"), EXTENSIONS)
def test_an_extended_run_continues_on_the_schedule_of_the_longer_run(tmp_path, schedule, stack):
    stack = [str(PROJECT_ROOT / part) if part.startswith("configs/") else part for part in stack]
    write_tiny_archive(tmp_path / "data")
    args = [*fit_args("data", f"--model.lr_schedule={schedule}"), *stack]
    (tmp_path / "short").mkdir()
    (tmp_path / "long").mkdir()
    run_cli(*args, "--trainer.max_epochs=1", "--data.data_dir=../data", cwd=tmp_path / "short")
    run_dir = only_run_dir(tmp_path / "short")
    last = run_dir / "checkpoints" / "last.ckpt"
    steps = torch.load(last, weights_only=True)["global_step"]
    first_session = scalars(run_dir, "train/lr")

    extend = [*args, "--trainer.max_epochs=2", "--data.data_dir=../data", "--ckpt_path=last"]
    refused = run_cli(*extend, cwd=tmp_path / "short", check=False)
    assert refused.returncode == 2 and "--allow_config_change" in refused.stderr
    run_cli(*extend, "--allow_config_change=true", cwd=tmp_path / "short")
    run_cli(*args, "--trainer.max_epochs=2", "--data.data_dir=../data", cwd=tmp_path / "long")

    assert torch.load(last, weights_only=True)["global_step"] == 2 * steps
    assert len((run_dir / "config_hash.txt").read_text().split()) == 2
    extended, planned_long = scalars(run_dir, "train/lr"), scalars(only_run_dir(tmp_path / "long"), "train/lr")
    assert extended.keys() == planned_long.keys() and extended
    for tag, by_step in planned_long.items():
        assert sorted(extended[tag]) == list(range(2 * steps))
        for step in range(steps):  # the first session followed the plan for its own length
            assert extended[tag][step] == first_session[tag][step]
        for step in range(steps, 2 * steps):  # then the plan for the new length, from where it stood
            assert extended[tag][step] == pytest.approx(by_step[step], rel=1e-6), (tag, step)


def test_the_fast_recipe_extends_and_validates_the_weights_it_ends_with(tmp_path):
    write_tiny_archive(tmp_path / "data", CIFAR10)
    fast = [part if not part.startswith("configs/") else str(PROJECT_ROOT / part) for part in FAST]
    args = ["fit", *fast, *FAST_ARGS[:1], "--data.num_workers=0", "--trainer.accelerator=cpu", "--data.data_dir=data"]
    # 192 training images in batches of 32: 6 steps per epoch; 9 steps end inside the second epoch.
    first = run_cli(*args, "--trainer.max_steps=9", cwd=tmp_path)
    assert "Note: data.val_size is 0" in first.stdout  # the best checkpoint is chosen on the test set, and it says so
    run_dir = only_run_dir(tmp_path)
    last = run_dir / "checkpoints" / "last.ckpt"
    assert sorted(scalars(run_dir, "val/top1")["val/top1"]) == [5, 8]  # the epoch's end and the final step

    run_cli(*args, "--trainer.max_steps=15", "--ckpt_path=last", "--allow_config_change=true", cwd=tmp_path)
    assert torch.load(last, weights_only=True)["global_step"] == 15
    final = scalars(run_dir, "val/top1")["val/top1"]
    assert sorted(final) == [5, 8, 11, 14]
    # last.ckpt holds exactly the weights that were validated at the final step.
    validated = run_cli("validate", *args[1:], "--trainer.max_steps=15", f"--ckpt_path={last}", cwd=tmp_path)
    (logged,) = run_dir.glob("validate/*/events.*")
    assert scalars(logged.parent, "val/top1")["val/top1"][0] == pytest.approx(final[14], abs=0)
    assert "Validate of" in validated.stdout


def test_ctrl_c_resume_extend_as_a_user_types_them(tmp_path):
    write_tiny_archive(tmp_path / "data")
    probe = "--trainer.callbacks+=engine_probes.KillAt"
    ctrl_c = {"KILL_AT": "train_batch:0:3", "KILL_SIGNAL": "SIGINT"}  # after the 4th batch
    stopped = run_cli(*fit_args("data", probe), cwd=tmp_path, check=False, env=ctrl_c)
    run_dir = only_run_dir(tmp_path)
    last = run_dir / "checkpoints" / "last.ckpt"
    assert stopped.returncode == 128 + signal.SIGINT  # 130, as a shell reports Ctrl-C
    message = f"Stopped by Ctrl-C at step 4; {(last.relative_to(tmp_path))} holds step 4: run the same command with"
    assert message in stopped.stdout
    assert torch.load(last, weights_only=True)["global_step"] == 4

    resumed = run_cli(*fit_args("data", probe, "--ckpt_path=last"), cwd=tmp_path)
    assert f"(resumed from {last.relative_to(tmp_path)})" in resumed.stdout
    assert "exists and is not empty" not in resumed.stderr
    assert torch.load(last, weights_only=True)["global_step"] == 10

    extend = ["--ckpt_path=last", "--trainer.max_epochs=3", "--allow_config_change=true"]
    run_cli(*fit_args("data", probe, *extend), cwd=tmp_path)
    assert torch.load(last, weights_only=True)["global_step"] == 30
    assert only_run_dir(tmp_path) == run_dir  # one run, continued


def test_a_run_is_trained_by_one_process_at_a_time(tmp_path):
    write_tiny_archive(tmp_path / "data")
    probe = "--trainer.callbacks+=engine_probes.KillAt"
    command = fit_args("data", probe, "--ckpt_path=last", "--allow_fresh_start=true")
    # The first fit stops itself (SIGSTOP) after its third batch: alive, holding the run.
    holder = subprocess.Popen(
        [sys.executable, str(project_of(command) / "main.py"), *command],
        cwd=tmp_path,
        env=cli_env(KILL_AT="train_batch:0:2", KILL_SIGNAL="SIGSTOP"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _, status = os.waitpid(holder.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status), "the first fit ended instead of pausing"
        run_dir = only_run_dir(tmp_path)
        lock = run_dir / "run.lock"
        assert lock.read_text() == f"pid {holder.pid} on {socket.gethostname()}\n"
        before = tree(tmp_path)
        second = run_cli(*command, cwd=tmp_path, check=False)
        assert second.returncode == 2
        assert second.stderr.splitlines() == [
            f"error: {run_dir.relative_to(tmp_path)} is being trained by pid {holder.pid} on {socket.gethostname()} "
            f"({lock.relative_to(tmp_path)}); wait for it to end or stop it, then resume with --ckpt_path last"
        ]
        assert tree(tmp_path) == before and lock.is_file()
    finally:
        holder.kill()  # kill -9: its lock file stays behind, its lock goes with it
        holder.wait()
    assert lock.is_file()
    taken_over = run_cli(*command, cwd=tmp_path)  # no prompt, no stale-lock error
    assert f"Run: {run_dir.relative_to(tmp_path)}" in taken_over.stdout
    assert not lock.exists()  # a finished run lets go of it
