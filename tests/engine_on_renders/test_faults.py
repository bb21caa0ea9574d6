"""Faults that end long runs, injected into real ``python main.py`` processes: each ends in one line.

Every row of the fault table (docs/runs.md) is here: a full disk, a GPU out of memory, a killed
loader worker, a diverged loss (full precision and bf16), a damaged data copy, a damaged checkpoint,
a read-only folder. Each asserts the exit status, the one ``error:`` line and what it names, the
run's ``logs/error.log`` (traceback and machine) and ``logs/console.log``, that the checkpoints
written before are byte for byte as they were, and that ``--ckpt_path last`` then continues from
the step the line named.

A full disk is a real one: a small tmpfs mounted over the run's checkpoints folder in a private mount
namespace (``unshare``), filled by a probe as the second epoch starts. Where no namespace can be made (no
``unshare``, or user namespaces switched off), a probe makes torch's writer fail with ``ENOSPC``
halfway through the file instead; the template's CI runs as root and uses the tmpfs.
"""

from __future__ import annotations

import hashlib
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from .conftest import (
    DATASET,
    cli_env,
    fit_args,
    only_run_dir,
    project_of,
    run_cli,
    trained_folder,
    tree,
    write_tiny_archive,
)

pytestmark = [
    pytest.mark.slow,  # a dozen real training processes
    pytest.mark.every_render,
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*:UserWarning"),
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A folder with data and one finished 1-epoch run (10 steps): the state faults must not damage."""
    return trained_folder(tmp_path_factory.mktemp("trained"))


@pytest.fixture
def work(trained, tmp_path) -> Path:
    """A copy of ``trained`` this test may damage."""
    shutil.copytree(trained, tmp_path / "work", symlinks=True)
    return tmp_path / "work"


def checkpoints(run_dir: Path) -> dict[str, str]:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in (run_dir / "checkpoints").iterdir()}


def one_error_line(result: subprocess.CompletedProcess, code: int = 1) -> str:
    """The one ``error:`` line of a failed command (no traceback on the screen), after checking its exit status."""
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode == code, result.stderr[-3000:]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "; " in lines[0]  # what happened; what to do
    return lines[0]


def assert_reported(root: Path, run_dir: Path, line: str, error_type: str) -> None:
    """The line ends with the run's error.log, which holds the traceback and the machine; console.log the line."""
    report = run_dir / "logs" / "error.log"
    assert line.endswith(f"; full report: {report})"), line  # the line ends with where the details are
    text = (root / report).read_text()
    assert "Traceback (most recent call last)" in text and error_type in text
    for fact in ("---- environment", "command: ", "torch ", "lightning ", "disk: ", "host memory: "):
        assert fact in text, fact
    console = (root / run_dir / "logs" / "console.log").read_text()
    assert line in console and " ---- " in console  # a header per session, then what it printed, time-stamped


def resume(root: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return run_cli(*fit_args("data", "--ckpt_path=last", *extra), cwd=root, env=env)


@pytest.mark.parametrize("precision", ["32-true", pytest.param("bf16-mixed", marks=pytest.mark.slow)])
def test_a_diverged_run_fails_at_the_step_its_loss_went_non_finite_and_checkpoints_no_nan(work, precision):
    run_dir = only_run_dir(work).relative_to(work)
    before = checkpoints(work / run_dir)
    diverging = ("--trainer.max_epochs=3", "--allow_config_change=true", f"--trainer.precision={precision}")
    result = run_cli(
        *fit_args("data", "--ckpt_path=last", *diverging, "--model.optimizer.init_args.lr=1e6"), cwd=work, check=False
    )
    line = one_error_line(result)
    assert "error: training diverged: the loss stopped being finite at step " in line, line
    first = int(line.split("finite at step ")[1].split(";")[0])
    assert first > 10 and f"{run_dir}/checkpoints/last.ckpt holds step 10" in line, line
    assert "--allow_config_change true" in line and "model.optimizer.init_args.lr" in line
    assert f"Diverged: the loss stopped being finite at step {first}" in result.stdout  # the summary says it too
    assert checkpoints(work / run_dir) == before  # no NaN model over a finite one, no best NaN model
    assert_reported(work, run_dir, line, "Error")

    # The state the line named continues, with a learning rate that does not diverge.
    resumed = resume(work, "--trainer.max_epochs=2", "--allow_config_change=true", f"--trainer.precision={precision}")
    assert "for 10 steps this session" in resumed.stdout and "last.ckpt (step 20)" in resumed.stdout


def test_a_run_diverging_before_its_first_checkpoint_writes_none(tmp_path):
    write_tiny_archive(tmp_path / "data")
    result = run_cli(*fit_args("data", "--model.optimizer.init_args.lr=1e6"), cwd=tmp_path, check=False)
    line = one_error_line(result)
    assert "training diverged: the loss stopped being finite at step" in line and "before any checkpoint" in line
    run_dir = only_run_dir(tmp_path).relative_to(tmp_path)
    assert not list((tmp_path / run_dir).glob("checkpoints/*.ckpt"))
    assert_reported(tmp_path, run_dir, line, "Error")


def private_mounts() -> list[str] | None:
    """``unshare`` arguments for a private mount namespace this process may mount in, or None if there is none."""
    if shutil.which("unshare") is None:
        return None
    for flags in (["--mount"], ["--mount", "--map-root-user"]):
        probe = subprocess.run(
            ["unshare", *flags, "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True
        )
        if probe.returncode == 0:
            return ["unshare", *flags]
    return None


def run_with_mounts(mounts: list[str], root: Path, setup: str, args: list[str], env: dict[str, str]):
    """``python main.py ARGS`` in ``root`` after the ``setup`` mount commands, in a namespace of its own.

    What the run left under ``root/runs`` is copied out before the namespace (and its mounts) ends,
    and put back in place of the mount point, so that the next command sees the runs as they were left.
    """
    command = shlex.join([sys.executable, str(project_of(args) / "main.py"), *args])
    script = f"{setup} && {command}; status=$?; mkdir -p kept && cp -a runs/. kept/; exit $status"
    result = subprocess.run(
        [*mounts, "sh", "-c", script], cwd=root, capture_output=True, text=True, timeout=300, env=cli_env(**env)
    )
    shutil.rmtree(root / "runs")
    (root / "kept").rename(root / "runs")
    return result


def test_a_full_disk_while_saving_names_the_checkpoint_that_is_left(work):
    run_dir = only_run_dir(work).relative_to(work)
    before = checkpoints(work / run_dir)
    args = fit_args("data", "--ckpt_path=last", "--trainer.max_epochs=2", "--allow_config_change=true")
    mounts = private_mounts()
    if mounts is not None:  # the checkpoints on a small filesystem of their own, filled as epoch 2 starts
        args += ["--trainer.callbacks+=engine_probes.FillDiskAt"]
        folder = shlex.quote(str(run_dir / "checkpoints"))
        setup = f"cp -a {folder} saved && mount -t tmpfs -o size=4m tmpfs {folder} && cp -a saved/. {folder}/"
        result = run_with_mounts(mounts, work, setup, args, {"FILL_AT": "1", "FILL_LEAVE": str(16 * 1024)})
        (work / run_dir / "checkpoints" / ".filler").unlink()
    else:  # no namespace here: the writer meets ENOSPC halfway through the file instead
        args += ["--trainer.callbacks+=engine_probes.NoSpaceAt"]
        result = run_cli(*args, cwd=work, check=False, env={"NO_SPACE_AT": "1"})
    line = one_error_line(result)
    assert line.startswith(f"error: no space left on the disk of {work / run_dir}/checkpoints to write "), line
    assert ".ckpt (needs about " in line and " MB free; nothing was kept)" in line
    assert f"{run_dir}/checkpoints/last.ckpt holds step 10: free space there" in line
    assert "then run the same command with --ckpt_path last" in line
    assert checkpoints(work / run_dir) == before  # and no partial file
    assert_reported(work, run_dir, line, "NoSpaceError")

    resumed = run_cli(*args, cwd=work, env={"FILL_AT": "-1"})
    assert "for 10 steps this session" in resumed.stdout and "last.ckpt (step 20)" in resumed.stdout
    console = (work / run_dir / "logs" / "console.log").read_text()
    assert console.count(" ---- ") == 3 and line in console  # the first session, the failed one, the resumed one


def test_out_of_gpu_memory_names_the_batch_and_keeps_the_last_completed_step(tmp_path):
    write_tiny_archive(tmp_path / "data")
    oom = ("--model.backbone=engine_probes.OutOfMemoryAt", "--allow_config_change=true")
    run_cli(*fit_args("data", *oom), cwd=tmp_path)  # one epoch, 10 steps
    run_dir = only_run_dir(tmp_path).relative_to(tmp_path)
    best = checkpoints(tmp_path / run_dir)["best-epoch=000.ckpt"]
    longer = (*oom, "--trainer.max_epochs=2")
    result = run_cli(*fit_args("data", "--ckpt_path=last", *longer), cwd=tmp_path, check=False, env={"OOM_AT": "4"})
    line = one_error_line(result)
    assert "error: out of GPU memory at step 14 with data.batch_size 16 per device" in line, line
    assert "data.global_batch_size 16 and trainer.accumulate_grad_batches 2" in line and "bf16-mixed" in line
    assert f"{run_dir}/checkpoints/last.ckpt holds step 13" in line
    assert checkpoints(tmp_path / run_dir)["best-epoch=000.ckpt"] == best
    assert_reported(tmp_path, run_dir, line, "OutOfMemoryError")

    resumed = resume(tmp_path, *longer)
    assert "for 7 steps this session" in resumed.stdout and "last.ckpt (step 20)" in resumed.stdout


def test_a_killed_loader_worker_is_named_and_the_run_resumes(work):
    run_dir = only_run_dir(work).relative_to(work)
    best = checkpoints(work / run_dir)["best-epoch=000.ckpt"]
    workers = ("--data.num_workers=2", "--data.storage=memmap", "--trainer.max_epochs=2")
    killing = (*workers, "--trainer.callbacks+=engine_probes.KillWorkerAt", "--allow_config_change=true")
    killed = {"KILL_WORKER_AT": "1:2"}
    result = run_cli(*fit_args("data", "--ckpt_path=last", *killing), cwd=work, check=False, env=killed)
    line = one_error_line(result)
    # Which of the two torch reports depends on which of its checks sees the dead worker first.
    assert "error: a data loader worker (pid " in line, line
    assert "was killed (Killed), most likely" in line or "exited unexpectedly, most likely" in line, line
    assert "lower data.num_workers (now 2)" in line and f"{run_dir}/checkpoints/last.ckpt holds step " in line
    # The loader notices the lost worker when it next waits for one of its batches: a step or two later.
    saved = int(line.split("last.ckpt holds step ")[1].split(":")[0])
    assert saved >= 13
    assert checkpoints(work / run_dir)["best-epoch=000.ckpt"] == best
    assert_reported(work, run_dir, line, "DataLoader worker")

    resumed = resume(work, *killing)
    assert "last.ckpt (step 20)" in resumed.stdout
    if saved < 20:
        assert f"for {20 - saved} steps this session" in resumed.stdout
    else:  # on a busy machine the loader may see the lost worker only once the epoch's batches are all in
        assert "Nothing left to train" in resumed.stdout


@pytest.mark.parametrize(
    ("torch_says", "named"),
    [
        ("DataLoader worker (pid 4242) is killed by signal: Killed. ", "(pid 4242) was killed (Killed), most likely"),
        ("DataLoader worker (pid(s) 4242, 4243) exited unexpectedly", "(pid 4242, 4243) exited unexpectedly, most"),
    ],
)
def test_both_of_torch_s_reports_of_a_dead_loader_worker_are_named(tmp_path, torch_says, named):
    """torch's SIGCHLD handler names the signal; its loader's timeout check, reached first at times, does not."""
    from types import SimpleNamespace

    from classifier_engine.faults.known_faults import describe_fault

    trainer = SimpleNamespace(state=SimpleNamespace(fn=None), datamodule=SimpleNamespace(num_workers=2))
    line = describe_fault(RuntimeError(torch_says), trainer, tmp_path, None)
    assert line.startswith(f"a data loader worker {named}") and "lower data.num_workers (now 2)" in line, line
    # The handler raises in whatever the main thread runs: inside TensorBoard's add_scalar, Lightning raises again.
    try:
        try:
            raise RuntimeError(torch_says)
        except RuntimeError as report:
            raise ValueError("you tried to log 262.3 which is currently not supported.") from report
    except ValueError as raised_again:
        line = describe_fault(raised_again, trainer, tmp_path, None)
    assert line.startswith(f"a data loader worker {named}"), line


class UndecodablePhotos(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> torch.Tensor:
        raise ValueError(f"photo {index} cannot be decoded")


def test_a_loader_worker_s_error_is_named_by_the_worker_s_own_last_line():
    """torch raises it again in the training process, the worker's traceback as its text; the line names the error."""
    from classifier_engine.faults.known_faults import WORKER_RAISED, worker_reason
    from classifier_engine.faults.rank_failure import short_reason

    with pytest.raises(ValueError, match=r"^Caught ValueError in DataLoader worker process 0") as raised:
        next(iter(torch.utils.data.DataLoader(UndecodablePhotos(), num_workers=1)))
    assert WORKER_RAISED.match(str(raised.value))
    assert worker_reason(str(raised.value)) == "ValueError: photo 0 cannot be decoded"
    assert short_reason(raised.value) == "a data loader worker failed"


def test_a_damaged_data_copy_is_rebuilt_from_its_archive_or_refused_without_it(work):
    cache = work / "data" / f"{DATASET.name}-uint8"
    images = cache / "train_images.npy"
    whole = images.read_bytes()
    images.write_bytes(whole[: len(whole) // 2])  # truncated, as a full disk or a crash leaves it
    extended = resume(work, "--trainer.max_epochs=2", "--allow_config_change=true")
    said = f"{cache.relative_to(work)} is damaged (train_images.npy has {len(whole) // 2:,} bytes"
    assert said in extended.stdout + extended.stderr
    assert images.read_bytes() == whole  # converted again from the archive, the same images

    flipped = bytearray(whole)
    flipped[len(whole) // 2 : len(whole) // 2 + 4] = b"\xff\x00\xff\x00"  # four bytes overwritten: same size
    images.write_bytes(bytes(flipped))
    (work / "data" / DATASET.archive_name).unlink()  # and the source gone
    before = tree(work)
    result = run_cli(*fit_args("data", "--data.download=false", "--trainer.logger.init_args.name=new"), cwd=work,
                     check=False)  # fmt: skip
    line = one_error_line(result)
    assert "cannot be used alone: train_images.npy has other bytes than when it was made" in line, line
    assert tree(work) == before  # refused before anything was built


@pytest.mark.parametrize("folder", ["runs", "data"])
def test_a_read_only_folder_is_refused_in_one_line_before_anything_is_built(tmp_path, folder):
    mounts = private_mounts()
    if mounts is None:
        pytest.skip("no private mount namespace here (unshare) for a read-only mount")
    write_tiny_archive(tmp_path / "data")
    (tmp_path / "runs").mkdir()
    before = tree(tmp_path)
    result = run_with_mounts(mounts, tmp_path, f"mount --bind -o ro {folder} {folder}", fit_args("data"), {})
    line = one_error_line(result)
    named = "runs/" if folder == "runs" else "data.data_dir data cannot be written (read-only or no permission)"
    assert named in line and ("Read-only file system" in line or folder == "data"), line
    assert tree(tmp_path) == before


def test_a_read_only_data_folder_with_its_converted_copy_trains(work):
    mounts = private_mounts()
    if mounts is None:
        pytest.skip("no private mount namespace here (unshare) for a read-only mount")
    args = fit_args("data", "--trainer.logger.init_args.name=shared")
    result = run_with_mounts(mounts, work, "mount --bind -o ro data data", args, {})
    assert result.returncode == 0 and "Time:" in result.stdout, result.stderr[-3000:]
