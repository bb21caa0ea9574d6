"""A fault on one rank ends every rank within seconds, under each launcher, and the run resumes exactly.

Two CPU processes with gloo; rank 1 alone fails as epoch 1's third batch starts (out of GPU memory, or
an exception in the step). Without the watch, rank 0 would wait in the step's all-reduce for the
process group's timeout (30 minutes in the DDP preset).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from .conftest import (
    PROJECT_ROOT,
    SLURM_ONE_TASK_JOB,
    cli_env,
    default_config,
    free_port,
    only_run_dir,
    slurm_stand_ins,
)
from .test_ddp import ddp_args, live_processes_of_group, write_indexed_archive

pytestmark = pytest.mark.slow  # two processes per run, three launchers; CI runs torchrun's
PROBE = "--trainer.callbacks+=engine_probes.FailAt"
FAULT = {"FAIL_AT": "1:2", "FAIL_RANK": "1"}  # epoch 0 (5 steps) is in last.ckpt; rank 1 fails in epoch 1
ENDED_WITHIN = 60  # seconds from the fault to the last process of the job


def run_job(command: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, str, float]:
    """Run a job in its own process group; its status, its output, and when its last process ended."""
    job = subprocess.Popen(
        command, cwd=cwd, env=cli_env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        output = job.communicate(timeout=600)[0]
        while live_processes_of_group(job.pid):
            time.sleep(0.2)
        return job.returncode, output, time.time()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)


def lightning(root: Path, *extra: str) -> tuple[list[str], Path, dict[str, str]]:
    return (
        [sys.executable, str(PROJECT_ROOT / "main.py"), *ddp_args(root, "--trainer.devices=2", PROBE, *extra)],
        root,
        {},
    )


def torchrun(root: Path, *extra: str) -> tuple[list[str], Path, dict[str, str]]:
    """As ``scripts/torchrun.sh`` runs it: torchrun's agent, its failure report in one line."""
    launcher = [sys.executable, "-m", "classifier_engine.torchrun", "--standalone", "--nproc_per_node=2"]
    command = [*launcher, str(PROJECT_ROOT / "main.py"), *ddp_args(root, "--trainer.devices=2", PROBE, *extra)]
    return command, root, {}


def slurm(root: Path, *extra: str) -> tuple[list[str], Path, dict[str, str]]:
    """``scripts/slurm.sbatch`` as SLURM runs it, its ``srun`` starting two tasks on this machine."""
    if not (root / "bin").exists():
        slurm_stand_ins(root, tasks=2)
    submit = root / "submit"
    env = {
        **SLURM_ONE_TASK_JOB,
        "SLURM_NTASKS": "2",
        "SLURM_NTASKS_PER_NODE": "2",
        "MASTER_PORT": str(free_port()),
        "SLURM_SUBMIT_DIR": str(submit),
        "PATH": f"{root / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "VIRTUAL_ENV": sys.prefix,
        "CONFIG": str(default_config()),
    }
    del env["SLURM_PROCID"], env["SLURM_LOCALID"]  # each task's own, from srun
    # The script gives the fit, the configs, num_nodes and devices; the probe and the tiny settings follow.
    options = ddp_args(submit, PROBE, *extra)[5:]
    return ["bash", str(PROJECT_ROOT / "scripts" / "slurm.sbatch"), *options], submit, env


LAUNCHERS = {"lightning": lightning, "torchrun": torchrun, "slurm": slurm}


@pytest.fixture(scope="module")
def reference_weights(tmp_path_factory) -> str:
    """The weights of the same two-rank run, never interrupted."""
    root = tmp_path_factory.mktemp("uninterrupted")
    write_indexed_archive(root / "data")
    command, cwd, env = lightning(root)
    status, output, _ = run_job(command, cwd, env)
    assert status == 0, output[-3000:]
    return json.loads((root / "probe" / "rank0.json").read_text())["weights"]


@pytest.mark.parametrize(
    ("launcher", "kind"),
    [("lightning", "oom"), pytest.param("torchrun", "error", marks=pytest.mark.every_render), ("slurm", "oom")],
    ids=lambda v: v,
)
def test_a_fault_on_one_rank_ends_every_rank_and_the_run_resumes_exactly(tmp_path, reference_weights, launcher, kind):
    command, cwd, env = LAUNCHERS[launcher](tmp_path)
    write_indexed_archive(cwd / "data")
    status, output, ended = run_job(command, cwd, {**env, **FAULT, "FAIL_KIND": kind})

    assert status != 0, output[-3000:]
    run_dir = only_run_dir(cwd)
    fault = float((run_dir / "fault.time").read_text())
    assert ended - fault <= ENDED_WITHIN, f"the job ended {ended - fault:.0f} s after the fault"
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: rank 1 failed: "), output[-3000:]
    assert ("out of GPU memory" if kind == "oom" else "the training step failed on purpose") in errors[0]
    assert "last.ckpt holds step 5" in errors[0] and "--ckpt_path last" in errors[0]
    assert "rank 0 stopped: rank 1 failed" in output
    assert "Traceback" not in output and "ChildFailedError" not in output  # no wall of tracebacks
    # last.ckpt is the end of epoch 0, the last step both ranks completed; no half-written file beside it.
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 5
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".")]
    blocks = (run_dir / "logs" / "error.log").read_text().split("\n==== ")
    assert len(blocks) == 1 and blocks[0].startswith("==== ") and "rank 1 failed" in blocks[0].splitlines()[0]

    command, cwd, env = LAUNCHERS[launcher](tmp_path, "--ckpt_path=last")
    status, output, _ = run_job(command, cwd, env)
    assert status == 0, output[-3000:]
    assert json.loads((cwd / "probe" / "rank0.json").read_text())["weights"] == reference_weights
