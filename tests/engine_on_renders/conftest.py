"""The engine's tests with the template's two default renders: CIFAR-10 and your own photos.

The library's own suite (classifier-engine/tests) needs no project; these run the engine through the
commands, models and configs a render gives its user, so they belong to the template.

Both are rendered from this repository's template once per session, once per process under ``pytest -n N`` (or
taken from ``ENGINE_TEST_PROJECTS``, two folders separated by ``os.pathsep``: a CIFAR render, then a photo render)
and made importable here and in every CLI subprocess, as installed projects are. The library itself is the
installed one.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from classifier_engine.data.cifar_format import FORMATS
from classifier_engine.testing import (  # noqa: F401  (for the tests)
    NUM_TEST,
    NUM_TRAIN,
    make_images,
    write_image_folder,
    write_tiny_archive,
)

# data_dir, fmt, and gpu-marked tests skipped where no CUDA device is
pytest_plugins = ["classifier_engine.testing.fixtures"]
HERE = Path(__file__).resolve().parent
TEMPLATE = HERE.parents[1]
LIBRARY_ROOT = TEMPLATE / "classifier-engine"


def rendered_projects() -> tuple[Path, Path]:
    """(CIFAR render, photo render): given, or rendered with the template's defaults into a folder of this session."""
    given = os.environ.get("ENGINE_TEST_PROJECTS")
    if given:
        cifar, photos = (Path(path).resolve() for path in given.split(os.pathsep))
        return cifar, photos
    from cookiecutter.main import cookiecutter

    output = Path(os.environ.get("ENGINE_TEST_RENDERS", HERE / ".renders"))
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # pytest -n N: each process renders its own pair
    if worker:
        output = output / worker
    config = output / "cookiecutterrc.yaml"
    output.mkdir(parents=True, exist_ok=True)
    config.write_text(f"cookiecutters_dir: {output / 'clones'}\nreplay_dir: {output / 'replay'}\n")
    projects = []
    for answers in ({}, {"dataset": "images"}):
        project = cookiecutter(
            str(TEMPLATE), no_input=True, extra_context=answers, output_dir=str(output),
            config_file=str(config), overwrite_if_exists=True,
        )  # fmt: skip
        projects.append(Path(project))
    return projects[0], projects[1]


PROJECT_ROOT, PHOTO_ROOT = rendered_projects()  # cifar_classifier and photo_classifier
# engine_probes (tests/support): callbacks and networks the CLI tests name by class_path in subprocesses.
IMPORT_PATHS = [
    str(PROJECT_ROOT / "src"),
    str(PHOTO_ROOT / "src"),
    str(HERE / "support"),
]
for _path in reversed(IMPORT_PATHS):
    if _path not in sys.path:
        sys.path.insert(0, _path)
os.environ["PYTHONPATH"] = os.pathsep.join([*IMPORT_PATHS, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
DATASET = FORMATS["cifar10"]  # the format the default config trains on


# Small, quiet, CPU-only settings stacked on the real config for CLI tests.
FAST_ARGS = [
    "--data.verify_checksum=false",
    "--data.val_size=32",
    "--data.batch_size=16",
    "--data.num_workers=0",
    "--model.backbone=cifar_classifier.models.backbones.FastCNN",  # the CLI is under test here, not the backbone
    "--model.backbone.width=4",
    "--trainer.accelerator=cpu",
    "--trainer.max_epochs=1",
    "--trainer.log_every_n_steps=1",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]


def free_port() -> int:
    """A TCP port nothing listens on now (a rendezvous, a model server)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(autouse=True)
def in_its_own_folder(tmp_path, monkeypatch):
    """Each test runs in its own temporary folder: what a command builds in-process under relative defaults
    (``data/packed``, ``data/``, ``runs/``) lands there, never in this checkout."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True)
def no_tracking_uri_from_an_earlier_test(monkeypatch):
    """``mlflow.set_tracking_uri`` (the registry, run in-process) exports MLFLOW_TRACKING_URI to every later
    subprocess: an export would register into another test's store, its artifacts in this folder. Each test
    starts without one, and leaves none."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    yield
    mlflow = sys.modules.get("mlflow")  # None where a test hides it
    if mlflow is not None:
        mlflow.set_tracking_uri(None)


def cli_env(**extra: str) -> dict[str, str]:
    """The environment for CLI subprocesses: both renders and ``engine_probes`` importable, plus ``extra``."""
    return {**os.environ, **extra}


def project_of(args: Sequence[object], cwd: Path | None = None) -> Path:
    """The render a command belongs to: the photo render when an argument names a file of it, or a config or a
    checkpoint of a run of its classes; else the CIFAR render (each render's commands load its own classes)."""
    for arg in args:
        value = str(arg).split("=", 1)[-1]
        if str(PHOTO_ROOT) in value:
            return PHOTO_ROOT
        path = Path(value) if Path(value).is_absolute() or cwd is None else Path(cwd) / value
        if path.suffix == ".ckpt":
            path = path.parent.parent / "config.yaml"  # <run>/checkpoints/<file>.ckpt: the run's config
        if path.suffix in (".yaml", ".yml") and path.is_file() and "photo_classifier." in path.read_text():
            return PHOTO_ROOT
    return PROJECT_ROOT


def run_cli(
    *args: str,
    cwd: Path,
    check: bool = True,
    timeout: float = 300,
    launcher: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run ``python [launcher] main.py ARGS`` in ``cwd`` exactly as a user would type it (``env`` adds variables).

    ``main.py`` of the render the command belongs to (``project_of``).
    """
    project = project_of(args, cwd)
    result = subprocess.run(
        [sys.executable, *launcher, str(project / "main.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(**(env or {})),
    )
    if check and result.returncode != 0:
        raise AssertionError(f"main.py {' '.join(args)} exited {result.returncode}:\n{result.stderr[-4000:]}")
    return result


def images_args(image_dir: Path | str, *extra: str) -> list[str]:
    """``fit`` with configs/images.yaml from scratch on ``image_dir``, tiny and quiet; ``extra`` comes last and wins.

    From scratch (``configs/presets/from_scratch.yaml``) and a tiny FastCNN: these runs test the data path
    and the run's life, not the fine-tune (``finetune_args``).
    """
    return [
        "fit",
        "--config",
        str(PHOTO_ROOT / "configs" / "images.yaml"),
        "--config",
        str(PHOTO_ROOT / "configs" / "presets" / "from_scratch.yaml"),
        f"--data.image_dir={image_dir}",
        "--data.image_size=32",
        "--data.val_fraction=0.25",
        "--data.batch_size=8",
        "--data.num_workers=0",
        "--data.pack_workers=2",
        "--model.backbone=photo_classifier.models.backbones.FastCNN",
        "--model.backbone.width=4",
        "--trainer.accelerator=cpu",
        "--trainer.max_epochs=2",
        "--trainer.log_every_n_steps=1",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        *extra,
    ]


def finetune_args(image_dir: Path | str, weights: Path, *extra: str) -> list[str]:
    """``fit`` with configs/images.yaml as shipped (its network from a weights file), small and quiet; ``extra`` wins.

    The default fine-tune at 32 px: the recipe's automatic choices are left as the config leaves them.
    """
    return [
        "fit",
        "--config",
        str(PHOTO_ROOT / "configs" / "images.yaml"),
        f"--data.image_dir={image_dir}",
        f"--model.backbone.weights_path={weights}",
        "--data.image_size=32",
        "--data.val_fraction=0.25",
        "--data.num_workers=0",
        "--data.pack_workers=2",
        "--trainer.accelerator=cpu",
        "--trainer.max_epochs=2",
        "--trainer.log_every_n_steps=1",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        *extra,
    ]


def tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` with the SHA-256 of its bytes, and every folder (an empty one is a leftover too).

    A data folder's lock file (``.<dataset>.lock``) is left out: any use of the folder makes it, and
    removing a lock file others may hold would break the lock. A run's ``run.lock`` is kept.
    """
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "folder"
        for path in sorted(root.rglob("*"))
        if not (path.is_file() and path.name.startswith(".") and path.name.endswith(".lock"))
    }


def trained_folder(root: Path) -> Path:
    """``root`` with a tiny archive in ``data/`` and one finished 1-epoch run (10 steps) of the default config."""
    write_tiny_archive(root / "data")
    run_cli(*fit_args("data"), cwd=root)
    return root


def default_config() -> Path:
    return PROJECT_ROOT / "configs" / "cifar10.yaml"


def fit_args(data_dir: Path | str, *extra: str) -> list[str]:
    """``fit`` with the default config, the tiny settings and ``data_dir``; ``extra`` comes last and wins."""
    return ["fit", "--config", str(default_config()), *FAST_ARGS, f"--data.data_dir={data_dir}", *extra]


def only_run_dir(root: Path) -> Path:
    """The one run directory under ``root/runs`` (a second one would mean a run went astray)."""
    runs = [p.parent for p in root.glob("runs/*/*/config.yaml")]
    assert len(runs) == 1, runs
    return runs[0]


# A one-task SLURM job as srun starts it: what Lightning reads to detect SLURM, and the job id.
SLURM_ONE_TASK_JOB = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NAME": "cifar-classifier",
    "SLURM_JOB_NUM_NODES": "1",
    "SLURM_NNODES": "1",
    "SLURM_NTASKS": "1",
    "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_NODELIST": "localhost",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
}


# srun with SLURM_NTASKS tasks on this machine: each task gets its SLURM_PROCID and SLURM_LOCALID; with
# --kill-on-bad-exit=1, a task that exits non-zero ends the others (SIGTERM, as srun does); the step's
# status is the first failing task's.
SRUN_TASKS = """
import os, signal, subprocess, sys, time
kill_on_bad_exit = "--kill-on-bad-exit=1" in sys.argv[1:]
command = [arg for arg in sys.argv[1:] if not arg.startswith("--kill-on-bad-exit")]
tasks = [
    subprocess.Popen(command, env={**os.environ, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank)})
    for rank in range(int(os.environ["SLURM_NTASKS"]))
]
failed = 0
while any(task.poll() is None for task in tasks):
    code = next((task.returncode for task in tasks if task.returncode not in (None, 0)), 0)
    if code and not failed:
        failed = code if code > 0 else 128 - code
        if kill_on_bad_exit:
            for task in tasks:
                if task.poll() is None:
                    task.send_signal(signal.SIGTERM)
    time.sleep(0.1)
failed = failed or next((t.returncode if t.returncode > 0 else 128 - t.returncode for t in tasks if t.returncode), 0)
sys.exit(failed)
"""


def slurm_stand_ins(root: Path, tasks: int = 1) -> tuple[Path, Path]:
    """``(bin, submit)``: ``srun``/``scontrol``/``python`` stand-ins, and a submit folder that is a checkout.

    ``scontrol`` records its arguments in ``<submit>/scontrol.log``; ``python`` is this interpreter;
    ``srun`` runs the command itself (one task), or ``SLURM_NTASKS`` tasks with ``tasks`` > 1.
    """
    bin_dir, submit_dir = root / "bin", root / "submit"
    bin_dir.mkdir()
    (bin_dir / "srun_tasks.py").write_text(SRUN_TASKS)
    one_task = '[ "${1:-}" = "--kill-on-bad-exit=1" ] && shift; exec "$@"'  # the command itself
    stand_ins = {
        "srun": one_task if tasks == 1 else f'exec "{sys.executable}" "{bin_dir / "srun_tasks.py"}" "$@"',
        "scontrol": 'echo "scontrol $*" >> "$SLURM_SUBMIT_DIR/scontrol.log"',
        "python": f'exec "{sys.executable}" "$@"',
    }
    for name, body in stand_ins.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    submit_dir.mkdir()
    for name in ("main.py", "sweep.py", "configs"):
        (submit_dir / name).symlink_to(PROJECT_ROOT / name)
    return bin_dir, submit_dir


def run_data_of(last: Path, data_dir: Path | None = None):
    """The run's data for its checkpoint ``last``, built as ``export.py --config <run>/config.yaml`` builds it."""
    from classifier_engine.export.model_loading import load_model
    from classifier_engine.export.run_data import load_run_data

    project = PHOTO_ROOT if "images" in yaml_text(last.parent.parent / "config.yaml") else PROJECT_ROOT
    package = "photo_classifier" if project == PHOTO_ROOT else "cifar_classifier"
    model_class = __import__(f"{package}.models", fromlist=["ImageClassifier"]).ImageClassifier
    config = project / "configs" / ("images.yaml" if project == PHOTO_ROOT else "cifar10.yaml")
    loaded = load_model(last, model_class, config, ["--config", str(last.parent.parent / "config.yaml")])
    return load_run_data(loaded, last, list(loaded.model.class_names), data_dir, "the check")


def yaml_text(path: Path) -> str:
    return path.read_text() if path.is_file() else ""
