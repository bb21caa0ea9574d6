"""A run killed at any moment and resumed with ``--ckpt_path last`` ends exactly where an uninterrupted run does.

Each cell runs the same command as an uninterrupted reference run (trained once per distinct
command, shared by the cells), in another folder, stopped at a chosen moment by
``engine_probes.KillAt`` (which reads the moment from the environment so that every attempt has
the same config): ``kill -9``, SIGTERM, or the cluster's SIGUSR1. It is resumed until it finishes.
The two final checkpoints must hold the same weights, optimizer and scheduler states, data and
random states, and TensorBoard must show the same scalars.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import timm
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from classifier_engine.data.cifar_format import CIFAR10

from .conftest import (
    FAST_ARGS,
    PROJECT_ROOT,
    SLURM_ONE_TASK_JOB,
    cli_env,
    default_config,
    finetune_args,
    fit_args,
    images_args,
    only_run_dir,
    project_of,
    run_cli,
    slurm_stand_ins,
    write_image_folder,
    write_tiny_archive,
)

pytestmark = [
    pytest.mark.slow,  # each cell starts three to five training processes
    pytest.mark.filterwarnings("ignore:You're resuming from a checkpoint that ended before the epoch ended"),
]

KILL_PROBE = "--trainer.callbacks+=engine_probes.KillAt"
# 160 training images in batches of 8: 20 steps per epoch, 3 epochs.
SMALL_RUN = ("--trainer.max_epochs=3", "--data.batch_size=8", KILL_PROBE)
# Checkpoint entries that describe the computation (loop counters and callback bookkeeping such as
# file paths and restart counts legitimately differ after a resume).
COMPARED_ENTRIES = ("global_step", "epoch", "state_dict", "optimizer_states", "lr_schedulers", "loops")
# Scalars of the throughput monitor (``<stage>/[device/]<name>``): they measure the machine, not the computation.
TIMING_NAMES = {"time", "batches", "samples", "batches_per_sec", "samples_per_sec"}


# What each signal leaves: SIGKILL nothing (the last epoch-end checkpoint is resumed); SIGTERM, Ctrl-C
# and SIGUSR1 (StopOnSignal) a checkpoint at the batch it arrived after, and exit status 128 + its number.
EXIT_STATUS = {
    "SIGKILL": -signal.SIGKILL,
    **{name: 128 + signal.Signals[name] for name in ("SIGTERM", "SIGINT", "SIGUSR1")},
}


def kill_and_resume(args: list[str], root: Path, kills: list[str], env: dict[str, str] | None = None) -> None:
    """Run ``fit ARGS`` stopped at ``kills[0]``, resume stopped at ``kills[1]``, ..., then resume to the end.

    A kill is ``MOMENT`` (SIGKILL) or ``MOMENT@SIGNAL``; ``env`` adds variables to every attempt.
    """
    for attempt, kill in enumerate(kills):
        moment, _, name = kill.partition("@")
        name = name or "SIGKILL"
        command = [
            sys.executable,
            str(project_of(args, root) / "main.py"),
            *args,
            *(["--ckpt_path=last"] if attempt else []),
        ]
        process = subprocess.Popen(
            command,
            cwd=root,
            env=cli_env(KILL_AT=moment, KILL_SIGNAL=name, **(env or {})),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own process group: loader workers and DDP ranks go with it
        )
        try:
            _, stderr = process.communicate(timeout=300)
        finally:
            with contextlib.suppress(ProcessLookupError):  # nothing left of the group
                os.killpg(process.pid, signal.SIGKILL)
        assert process.returncode == EXIT_STATUS[name], f"not stopped by {name} at {moment}:\n{stderr[-3000:]}"
    run_cli(*args, "--ckpt_path=last", cwd=root, env=env)


def assert_same(first: object, second: object, where: str) -> None:
    if isinstance(first, torch.Tensor):
        assert isinstance(second, torch.Tensor), f"{where}: not a tensor"
        assert torch.equal(first, second), f"{where} differs"
    elif isinstance(first, dict):
        assert isinstance(second, dict) and first.keys() == second.keys(), f"{where}: keys differ"
        for key in first:
            assert_same(first[key], second[key], f"{where}.{key}")
    elif isinstance(first, list | tuple):
        assert isinstance(second, list | tuple) and len(first) == len(second), f"{where}: lengths differ"
        for index, (a, b) in enumerate(zip(first, second, strict=True)):
            assert_same(a, b, f"{where}[{index}]")
    else:
        assert first == second, f"{where}: {first!r} != {second!r}"


def scalars(run_dir: Path) -> dict[str, dict[int, float]]:
    """Every scalar as TensorBoard shows it (a resumed run's re-logged steps replace the killed ones)."""
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {
        tag: {event.step: event.value for event in events.Scalars(tag)}
        for tag in events.Tags()["scalars"]
        if tag.rsplit("/", 1)[-1] not in TIMING_NAMES
    }


def assert_same_run(reference: Path, resumed: Path, compare_scalars: bool = True) -> None:
    expected, actual = (only_run_dir(root) for root in (reference, resumed))
    assert expected.name == actual.name  # the same config, so the same run directory name
    checkpoints = [torch.load(d / "checkpoints" / "last.ckpt", weights_only=True) for d in (expected, actual)]
    for entry in COMPARED_ENTRIES:
        assert entry in checkpoints[0] and entry in checkpoints[1], f"{entry} missing from a checkpoint"
        if entry == "loops":  # the fit loop's progress counters; restart bookkeeping aside
            progress = [c[entry]["fit_loop"]["epoch_loop.batch_progress"]["total"] for c in checkpoints]
            assert_same(*progress, "batch progress")
        else:
            assert_same(checkpoints[0][entry], checkpoints[1][entry], entry)
    assert_same(checkpoints[0]["callbacks"]["RandomState"], checkpoints[1]["callbacks"]["RandomState"], "random state")
    for entry in ("current_model_state", "averaging_state"):  # weight averaging's training weights and counter
        if entry in checkpoints[0]:
            assert_same(checkpoints[0][entry], checkpoints[1].get(entry), entry)
    if not compare_scalars:
        return
    expected_scalars, actual_scalars = scalars(expected), scalars(actual)
    assert expected_scalars.keys() == actual_scalars.keys()
    for tag, values in expected_scalars.items():
        assert actual_scalars[tag] == values, f"scalar {tag} differs"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """``reference(args, write_data)``: the folder of an uninterrupted ``main.py ARGS`` run, trained once per module."""
    trained: dict[tuple, Path] = {}

    def train(args: list[str], write_data=write_tiny_archive) -> Path:
        key = (tuple(args), write_data)
        if key not in trained:
            root = tmp_path_factory.mktemp("reference")
            write_data(root / "data")
            run_cli(*args, cwd=root)
            trained[key] = root
        return trained[key]

    return train


def reference_and_resumed(
    tmp_path: Path,
    reference,
    args: list[str],
    kills: list[str],
    write_data=write_tiny_archive,
    compare_scalars: bool = True,
    env: dict[str, str] | None = None,
) -> None:
    write_data(tmp_path / "data")
    kill_and_resume(args, tmp_path, kills, env)
    assert_same_run(reference(args, write_data), tmp_path, compare_scalars)


# The moments: mid-epoch; during validation; right after an epoch's checkpoints are written; and a
# resume that is itself killed during its sanity check (it must leave the checkpoint as it was).
MOMENTS = {
    "mid-epoch": ["train_batch:1:6"],
    # A checkpoint written in the middle of epoch 1 (after batch 6 of 20) resumes at batch 7 of the
    # same order, with the same augmentation draws.
    "sigterm-mid-epoch": ["train_batch:1:6@SIGTERM"],
    "sigusr1-mid-epoch": ["train_batch:1:6@SIGUSR1"],  # outside SLURM: the same stop, no requeue
    "ctrl-c-mid-epoch": ["train_batch:1:6@SIGINT"],
    "validation": ["validation:1"],
    "after-checkpoint": ["after_checkpoint:1"],
    "resume-killed-in-sanity-check": ["train_batch:1:6", "sanity"],
}
SETTINGS = {
    "default-workers": [],  # the default config's loader: 2 persistent workers over the memory map
    "no-workers": ["--data.num_workers=0"],
    "device-storage": ["--data.storage=device"],
}
CELLS = [
    pytest.param(
        setting,
        moment,
        id=f"{setting}-{moment}",
        marks=[pytest.mark.every_render] if (setting, moment) == ("default-workers", "sigterm-mid-epoch") else [],
    )
    for setting in SETTINGS
    for moment in MOMENTS
    # the default loader gets every moment (SIGUSR1 in the SLURM job below); the others the two that
    # cut an epoch, and device storage (no loader workers, batches gathered on the device) the signals
    if (setting == "default-workers" and moment != "sigusr1-mid-epoch")
    or moment in ("mid-epoch", "validation")
    or (setting == "device-storage" and moment in ("sigterm-mid-epoch", "sigusr1-mid-epoch"))
]


@pytest.mark.parametrize(("setting", "moment"), CELLS)
def test_a_killed_run_resumes_to_exactly_the_uninterrupted_result(tmp_path, reference, setting, moment):
    # After FAST_ARGS' num_workers=0: the config's value (2) unless the setting says otherwise.
    args = fit_args("data", *SMALL_RUN, "--data.num_workers=2", *SETTINGS[setting])
    reference_and_resumed(tmp_path, reference, args, MOMENTS[moment])


def test_ctrl_c_at_a_terminal_on_an_epochs_last_batch_stops_cleanly_and_resumes(tmp_path):
    # A terminal's Ctrl-C reaches the loader workers too; after an epoch's last batch the validation still
    # runs before the stop, on workers that must have survived the signal (exit 130, no traceback).
    args = fit_args("data", *SMALL_RUN, "--data.num_workers=2")
    write_tiny_archive(tmp_path / "data")
    kill_and_resume(args, tmp_path, ["train_batch:1:19@SIGINT"], env={"KILL_GROUP": "1"})
    (last,) = tmp_path.glob("runs/*/*/checkpoints/last.ckpt")
    assert torch.load(last, weights_only=True)["global_step"] == 3 * 20


@pytest.mark.every_render
def test_a_scheduler_s_sigterm_to_every_process_keeps_the_step_it_stopped_at(tmp_path, reference):
    # SLURM signals every process of a job step: the loader workers die of the SIGTERM while the stop's
    # checkpoint is being written. It must still hold the step the run stopped at, with no traceback on screen.
    args = fit_args("data", *SMALL_RUN, "--data.num_workers=2")
    write_tiny_archive(tmp_path / "data")
    stopped = subprocess.run(
        [sys.executable, str(project_of(args, tmp_path) / "main.py"), *args], cwd=tmp_path, capture_output=True,
        text=True, timeout=300, start_new_session=True,
        env=cli_env(KILL_AT="train_batch:1:6", KILL_SIGNAL="SIGTERM", KILL_GROUP="1"),
    )  # fmt: skip
    assert stopped.returncode == EXIT_STATUS["SIGTERM"], stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr + stopped.stdout and "race condition" not in stopped.stderr
    (last,) = tmp_path.glob("runs/*/*/checkpoints/last.ckpt")
    assert torch.load(last, weights_only=True)["global_step"] == 20 + 7  # epoch 1's batch 6 ended the run
    run_cli(*args, "--ckpt_path=last", cwd=tmp_path)
    assert_same_run(reference(args), tmp_path, True)


def test_a_stopped_two_process_run_resumes_to_exactly_the_uninterrupted_result(tmp_path, reference):
    ddp = ["--config", str(PROJECT_ROOT / "configs" / "presets" / "ddp.yaml"), "--trainer.accelerator=cpu"]
    args = fit_args("data", *SMALL_RUN, *ddp, "--trainer.devices=2", "--data.num_workers=2")
    # 10 steps per epoch on each rank. Only rank 0 is signalled, so the other rank learns of a stop
    # from the ranks' agreement: SIGKILL after batch 1 of epoch 1 (resumed from the epoch's start),
    # SIGUSR1 after its batch 5, SIGTERM after batch 2 of epoch 2; each resumed until the run ends.
    kills = ["train_batch:1:1", "train_batch:1:5@SIGUSR1", "train_batch:2:2@SIGTERM"]
    reference_and_resumed(tmp_path, reference, args, kills, env={"KILL_RANK": "0"})


def test_an_accumulating_run_stops_after_the_step_and_resumes_exactly(tmp_path, reference):
    args = fit_args("data", *SMALL_RUN, "--data.num_workers=0", "--trainer.accumulate_grad_batches=2")
    # 20 batches of 8 per epoch, 2 per optimizer step: 10 steps per epoch. SIGTERM after batch 6 of
    # epoch 1 (its 7th) lands inside a step: the stop waits for batch 7, so last.ckpt is at step 10 + 4.
    write_tiny_archive(tmp_path / "data")
    signalled = {"KILL_AT": "train_batch:1:6", "KILL_SIGNAL": "SIGTERM"}
    stopped = run_cli(*args, cwd=tmp_path, check=False, env=signalled)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    (last,) = tmp_path.glob("runs/*/*/checkpoints/last.ckpt")
    assert torch.load(last, weights_only=True)["global_step"] == 10 + 4
    run_cli(*args, "--ckpt_path=last", cwd=tmp_path)
    assert_same_run(reference(args), tmp_path)


def image_folder(data_dir: Path) -> None:
    write_image_folder(data_dir / "images", per_class=24)


@pytest.mark.parametrize(
    "kill",
    ["train_batch:1:3@SIGTERM", "train_batch:1:3"],  # CI resumes the default fine-tune on a folder exactly (below)
    ids=["sigterm", "kill-9"],
)
def test_a_run_on_a_folder_of_images_stopped_mid_epoch_resumes_to_exactly_the_uninterrupted_result(
    tmp_path, reference, kill
):
    # 54 training images in 6 batches of 8 after the held-out quarter; two loader workers over the packed copy.
    args = images_args("data/images", "--trainer.max_epochs=3", "--data.num_workers=2", KILL_PROBE)
    reference_and_resumed(tmp_path, reference, args, [kill], write_data=image_folder)


def imbalanced_folder(data_dir: Path) -> None:
    write_image_folder(data_dir / "images", classes=("common", "other"), per_class=30)
    write_image_folder(data_dir / "images", classes=("rare",), per_class=4)


# the full tier (-m slow) only: CI's time
def test_a_balanced_sampler_run_stopped_by_sigterm_resumes_to_exactly_the_uninterrupted_result(tmp_path, reference):
    # Each epoch's draw (with replacement, each class alike) comes from (seed, epoch): the resumed run draws the
    # same batches and skips those already trained, as the shuffled order does.
    args = images_args("data/images", "--trainer.max_epochs=3", "--data.num_workers=2", "--data.sampler=balanced",
                       KILL_PROBE)  # fmt: skip
    reference_and_resumed(tmp_path, reference, args, ["train_batch:1:2@SIGTERM"], write_data=imbalanced_folder)


@pytest.mark.every_render
def test_the_default_fine_tune_stopped_mid_epoch_resumes_to_exactly_the_uninterrupted_result(tmp_path, reference):
    # configs/images.yaml as shipped, its automatic choices left to the folder (a batch of 16: 3 steps an epoch):
    # both copies of the averaged weights, the head-then-body freeze and the body's own learning rate, plus
    # CutMix's draws; the default network from a weights file (random: resuming does not depend on the values).
    weights = tmp_path / "default.pth"
    torch.manual_seed(0)
    torch.save(timm.create_model("tf_efficientnet_lite1").state_dict(), weights)
    args = finetune_args("data/images", weights, "--trainer.max_epochs=3", "--data.num_workers=2",
                         "--data.cutmix_alpha=1.0", KILL_PROBE)  # fmt: skip
    reference_and_resumed(tmp_path, reference, args, ["train_batch:1:1@SIGTERM"], write_data=image_folder)
    last = torch.load(next(tmp_path.glob("runs/*/*/checkpoints/last.ckpt")), weights_only=True)
    assert "current_model_state" in last and int(last["averaging_state"]["n_averaged"]) == 3 * 3


# Stacked configs that replace a default list (lists are replaced, not merged): what the run relies
# on is installed whatever the list says.
REPLACED_LISTS = {
    "callbacks": (
        "trainer:\n  callbacks:\n    - class_path: lightning.pytorch.callbacks.EarlyStopping\n"
        "      init_args: {monitor: val/top1, mode: max, patience: 100}\n    - class_path: engine_probes.KillAt\n"
    ),
    "plugins": "trainer:\n  plugins:\n    - class_path: lightning.pytorch.plugins.environments.LightningEnvironment\n",
}


def archive_and_stacked_config(data_dir: Path, text: str) -> None:
    write_tiny_archive(data_dir)
    (data_dir.parent / "stacked.yaml").write_text(text)


@pytest.mark.parametrize("replaced", sorted(REPLACED_LISTS))
def test_a_stacked_config_replacing_a_default_list_still_stops_with_a_checkpoint_and_resumes_exactly(
    tmp_path, reference, replaced
):
    write_data = partial(archive_and_stacked_config, text=REPLACED_LISTS[replaced])
    args = fit_args("data", "--trainer.max_epochs=3", "--data.batch_size=8", "--config=stacked.yaml", KILL_PROBE)
    if replaced == "callbacks":  # the stacked list already holds the probe
        args.remove(KILL_PROBE)
    write_data(tmp_path / "data")
    signalled = {"KILL_AT": "train_batch:1:6", "KILL_SIGNAL": "SIGTERM"}
    stopped = run_cli(*args, cwd=tmp_path, check=False, env=signalled)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    last = only_run_dir(tmp_path) / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 20 + 7
    message = f"Stopped by SIGTERM at step 27; {last.relative_to(tmp_path)} holds step 27: run the same command"
    assert message in stopped.stdout
    assert "was raised with message" not in stopped.stdout + stopped.stderr  # Lightning's garbled line stays out
    run_cli(*args, "--ckpt_path=last", cwd=tmp_path)
    assert_same_run(reference(args, write_data), tmp_path)


def slurm_job(submit_dir: Path, bin_dir: Path, args: list[str], **env: str) -> subprocess.CompletedProcess:
    """``scripts/slurm.sbatch ARGS`` run as SLURM runs it, with ``srun`` and ``scontrol`` stand-ins first on PATH."""
    job_env = {
        **SLURM_ONE_TASK_JOB,
        "SLURM_SUBMIT_DIR": str(submit_dir),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "VIRTUAL_ENV": sys.prefix,  # the test's environment is the job's
        "CONFIG": str(default_config()),  # the CIFAR config these tests write data for
        **env,
    }
    script = PROJECT_ROOT / "scripts" / "slurm.sbatch"
    command = ["bash", str(script), *args]
    return subprocess.run(command, cwd=submit_dir, env=cli_env(**job_env), capture_output=True, text=True, timeout=300)


def test_a_slurm_job_warned_with_sigusr1_is_requeued_and_resumes_exactly(tmp_path, reference):
    bin_dir, submit_dir = slurm_stand_ins(tmp_path)
    write_tiny_archive(submit_dir / "data")
    options = [*FAST_ARGS, "--data.data_dir=data", *SMALL_RUN, "--data.num_workers=2"]

    warned = slurm_job(submit_dir, bin_dir, options, KILL_AT="train_batch:1:6", KILL_SIGNAL="SIGUSR1")
    assert warned.returncode == 128 + signal.SIGUSR1, warned.stderr[-3000:]
    assert (submit_dir / "scontrol.log").read_text() == "scontrol requeue 4242\n"
    assert "Requeued SLURM job 4242" in warned.stdout
    run_dir = only_run_dir(submit_dir)
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 20 + 7  # written at the batch the signal arrived after
    assert not list(run_dir.glob("hpc_ckpt_*.ckpt"))  # Lightning's own mid-step save is not made

    requeued = slurm_job(submit_dir, bin_dir, options)  # what the requeued job runs: the same script
    assert requeued.returncode == 0, requeued.stderr[-3000:]
    assert (submit_dir / "scontrol.log").read_text() == "scontrol requeue 4242\n"
    ddp = ["--config", str(PROJECT_ROOT / "configs" / "presets" / "ddp.yaml")]
    script_args = ["fit", "--config", str(default_config()), *ddp, "--trainer.num_nodes=1", "--trainer.devices=1"]
    assert_same_run(reference([*script_args, *options]), submit_dir)


def test_a_run_killed_after_a_step_checkpoint_resumes_from_it_exactly(tmp_path, reference):
    steps = ["--config", str(PROJECT_ROOT / "configs" / "presets" / "step_checkpoints.yaml")]
    args = fit_args("data", *SMALL_RUN, "--data.num_workers=2", *steps, "--safety.last_every_n_train_steps=4")
    # last.ckpt at global step 28 (after batch 7 of epoch 1); SIGKILL at step 30: the resume starts
    # mid-epoch, and the cut epoch's training averages still cover all its batches.
    reference_and_resumed(tmp_path, reference, args, ["train_batch:1:9"])


def test_the_fast_recipe_killed_mid_epoch_resumes_to_exactly_the_uninterrupted_result(tmp_path, reference):
    args = [
        "fit", "--config", str(default_config()), "--config", str(PROJECT_ROOT / "configs" / "cifar10_fast.yaml"),
        "--data.data_dir=data",
        "--data.verify_checksum=false", "--data.global_batch_size=32", "--model.backbone.width=4",
        "--trainer.max_steps=15", "--trainer.accelerator=cpu",
        "--trainer.log_every_n_steps=1", "--trainer.enable_progress_bar=false", KILL_PROBE,
    ]  # fmt: skip
    # 192 images in batches of 32: 6 steps per epoch; killed at step 9, ends inside epoch 2.
    # Scalars are not compared: when a max_steps run resumes at an epoch boundary, Lightning 2.6 logs
    # every later value one step late (its fit loop counts that epoch's last batch twice).
    reference_and_resumed(
        tmp_path, reference, args, ["train_batch:1:2"], partial(write_tiny_archive, fmt=CIFAR10), compare_scalars=False
    )
