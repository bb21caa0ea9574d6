"""Render, install, run the rendered project's own tests, and train it as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from xml.etree import ElementTree

import pytest
import yaml

pytestmark = pytest.mark.slow

LIBRARY = Path(__file__).resolve().parents[1] / "classifier-engine"
# The library's own suite needs no project: its quick tier runs on the built wheel alone (the reference model).
LIBRARY_SUITE = ([], 900)
ON_RENDERS = Path(__file__).resolve().parent / "engine_on_renders"
# The engine's tests with the renders (tests/engine_on_renders) run once, against the two default renders. CI
# runs their quick tier (every module at least once, the CLI through real processes) and the slow tests marked
# every_render: the mistakes table, the faults (a full disk on a tmpfs, OOM, a killed worker, divergence),
# two-process DDP, a fault on one rank under torchrun, a signal mid-epoch resumed exactly (the archive, the
# default fine-tune), the previous release's run resumed, the Dockerfile's commands. The others (the
# kill-and-resume matrix, sweeps, trackers, the fast recipe, streaming across ranks, one command's whole
# cross-validation, MLflow serving, the Kubeflow job) are the full tier: ENGINE_TIER=full scripts/test.sh runs
# every test (the template's nightly workflow does). Each suite has a time budget (seconds on 2 cores): a hang
# fails it without waiting for the CI limit. The engine's run in two processes (pytest-xdist, a module to a
# process for its module-scoped runs), each subprocess on one CPU thread: its commands spend much of their time
# starting (importing torch and Lightning, on one core), and one thread each keeps two training runs from
# fighting over both cores.
ENGINE_TIERS = {
    "ci": (["-m", "not slow or every_render", "-n", "2", "--dist", "loadfile"], 3000),
    "full": (["-m", "slow or not slow", "-n", "2", "--dist", "loadfile"], 9000),
}
ENGINE_SUITE = ENGINE_TIERS[os.environ.get("ENGINE_TIER", "ci")]
ENGINE_ENV = {"OMP_NUM_THREADS": "1"}
# The only reasons a test may be skipped: no GPU, no browser for the TensorBoard pages, no mount namespace.
ALLOWED_SKIPS = ("needs a CUDA device", "no headless Chromium", "no private mount namespace")
# Each render is installed with its lock, passes its own tests (a plain `pytest`, under 2 minutes) and trains
# its own configured network as its README says.
RENDERS = [
    pytest.param({"project_name": "Baked Default"}, id="defaults"),
    pytest.param({"project_name": "Baked Photos", "dataset": "images", "backbone": "resnet18"}, id="images-resnet18"),
    pytest.param({"project_name": "Baked Hundred", "dataset": "cifar100", "backbone": "resnet18"},
                 id="cifar100-resnet18"),
]  # fmt: skip
# A hang guard, not a speed claim: the photo render's suite takes about 90 s alone here, its walk (fit, stop,
# resume, test, predict, export) most of it, and more on a busy machine.
OWN_SUITE_BUDGET = 180


def child_env(env: dict | None) -> dict:
    """This process's environment for a command, ``env`` on top."""
    return {**os.environ, "PYTHONWARNINGS": "ignore::FutureWarning", **(env or {})}


def run(*command: str, cwd: Path, timeout: float = 900, env: dict | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=child_env(env))
    assert result.returncode == 0, (
        f"{' '.join(command)} exited {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    return result


def tail(log: Path, lines: int = 60) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def pip(*args: str, cwd: Path) -> None:
    run(sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", *args, cwd=cwd)


def uninstall(*names: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "uninstall", "-q", "-y", *names], check=False)


def without_library_source(lock: Path, destination: Path) -> Path:
    """The lock less its line saying where classifier-engine comes from, so that a given wheel of it installs."""
    destination.write_text("".join(line for line in lock.read_text().splitlines(keepends=True)
                                   if not line.startswith("classifier-engine @ ")))  # fmt: skip
    return destination


@pytest.fixture
def installed(bake, request):
    """A rendered project installed into this environment with its lock, as its README says (uninstalled after).

    The full lock rather than the CPU one: its torch is the one installed here (the CPU lock's Linux torch comes
    from PyTorch's own index); every other pin is the same. The library comes from this checkout, as the lock says.
    """
    project = bake(**request.param)
    pip("-c", "constraints.txt", "-e", f"{project}[dev]", cwd=project)
    yield project
    uninstall(project.name, "classifier-engine")


def checkout_files(folder: Path) -> set[Path]:
    """The files under ``folder`` but Python's and the test tools' own caches."""
    caches = {"__pycache__", ".hypothesis", ".pytest_cache"}
    return {path for path in folder.rglob("*") if path.is_file() and not caches & set(path.parts)}


def run_suite(folder: Path, pytest_args: list[str], budget: float, report: Path, env: dict | None = None) -> None:
    """A suite's pytest with its output in a log beside its report: past its budget it fails with the log's last
    lines (the tests it had finished, on each process) and its slowest tests, not only the time."""
    log = report.with_suffix(".log")
    command = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", f"--junitxml={report}",
               "--durations=25", *pytest_args]  # fmt: skip
    with log.open("w") as output:
        try:
            result = subprocess.run(
                command,
                cwd=folder,
                stdout=output,
                stderr=subprocess.STDOUT,
                timeout=budget,
                env=child_env(env),
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"{folder.name}'s tests ran past their {budget} s; the last lines:\n{tail(log)}")
    assert result.returncode == 0, f"{folder.name}'s tests exited {result.returncode}:\n{tail(log)}"
    print(tail(log, 40))  # the slowest tests, in this test's captured output
    suite = ElementTree.parse(report).getroot().find("testsuite")
    assert int(suite.get("failures")) == 0 and int(suite.get("errors")) == 0 and int(suite.get("tests")) > 0
    for case in suite.iter("testcase"):  # a test may be skipped only for a machine it cannot run on
        skipped = case.find("skipped")
        if skipped is not None:
            reason = skipped.get("message", "")
            assert reason.startswith(ALLOWED_SKIPS), f"{case.get('name')} was skipped: {reason}"


def test_the_built_wheel_passes_its_own_suite_alone_and_the_engine_suite_with_both_default_renders(bake, tmp_path):
    """The library as released (its wheel, built here) under its own tests with no project installed, then with
    the CIFAR and the photo render."""
    # The release workflow's build (.github/workflows/release-engine.yml), offline: the wheel and the sdist.
    wheel_dir = tmp_path / "dist"
    run(sys.executable, "-m", "build", "--no-isolation", "--outdir", str(wheel_dir), str(LIBRARY), cwd=tmp_path)
    (wheel,) = wheel_dir.glob("classifier_engine-*-py3-none-any.whl")
    (sdist,) = wheel_dir.glob("classifier_engine-*.tar.gz")
    assert sdist.name.removesuffix(".tar.gz") == wheel.name.split("-py3")[0]  # one version for both
    run(sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist), cwd=tmp_path)  # as the index will
    with tarfile.open(sdist) as archive:  # the sdist documents and checks the library: docs, changelog, tests
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {"CHANGELOG.md", "SECURITY.md", "src/classifier_engine/docs/tests.md", "tests/conftest.py"} <= names
    with zipfile.ZipFile(wheel) as archive:  # the benchmarks ship with the library: python -m classifier_engine.bench
        shipped = set(archive.namelist())
    assert {"classifier_engine/bench/bench_step.py", "classifier_engine/bench/gpu_figures.sh"} <= shipped
    pages = ("benchmarks", "cluster", "cross_validation", "design", "report", "runs", "shipping", "tests")
    assert {f"classifier_engine/docs/{page}.md" for page in pages} <= shipped
    cifar, photos = bake(), bake(dataset="images")
    lock = without_library_source(cifar / "constraints.txt", tmp_path / "lock.txt")
    try:
        # The wheel with every extra, alone: its suite, from the sdist's copy, sees no project.
        pip("-c", str(lock), f"{wheel}[sweep,mlflow,wandb,labels,streaming,serve]", cwd=tmp_path)
        installed = run(sys.executable, "-m", "pip", "show", "-f", "classifier-engine", cwd=tmp_path).stdout
        assert "Editable project location" not in installed and f"Version: {wheel.name.split('-')[1]}" in installed
        unpacked = tmp_path / "sdist"
        with tarfile.open(sdist) as archive:
            archive.extractall(unpacked, filter="data")
        (library,) = unpacked.iterdir()
        run_suite(library, *LIBRARY_SUITE, tmp_path / "library.xml")
        # Both renders (their own dependencies: timm, ...) over it, and the engine's suite with them.
        pip("-c", str(lock), "-e", str(cifar), "-e", str(photos), cwd=tmp_path)
        projects = os.pathsep.join([str(cifar), str(photos)])
        env = {**ENGINE_ENV, "ENGINE_TEST_PROJECTS": projects}
        before = checkout_files(ON_RENDERS)
        run_suite(ON_RENDERS, *ENGINE_SUITE, tmp_path / "engine.xml", env=env)
        assert checkout_files(ON_RENDERS) == before  # the tests wrote nothing into this checkout
    finally:
        uninstall("classifier-engine", cifar.name, photos.name)


def train_and_export_a_folder_of_photos(project: Path, package: str, tmp_path: Path) -> None:
    """The rendered README's commands on class folders of JPEG/PNG files of mixed sizes and modes, one of them bad."""
    write = (
        "import sys, numpy as np\n"
        "from pathlib import Path\n"
        "from PIL import Image\n"
        "rng = np.random.default_rng(0)\n"
        "for label, name in enumerate(['cat', 'dog', 'red panda']):\n"
        "    (Path(sys.argv[1]) / name).mkdir(parents=True)\n"
        "    for index in range(30):\n"
        "        size = tuple(int(side) for side in rng.integers(40, 300, 2))\n"
        "        pixels = rng.integers(0, 80, (size[1], size[0], 3)) + np.eye(3, dtype=int)[label] * 170\n"
        "        image = Image.fromarray(pixels.astype(np.uint8))\n"
        "        if index % 3 == 1: image = image.convert('L')\n"
        '        image.save(Path(sys.argv[1]) / name / f\'{index}.{("jpg", "png", "JPG")[index % 3]}\')\n'
        "(Path(sys.argv[1]) / 'cat' / 'broken.jpg').write_bytes(b'not an image')\n"
    )
    photos = tmp_path / "photos"
    run(sys.executable, "-c", write, str(photos), cwd=tmp_path)
    # The README's first command fine-tunes a timm network from its ImageNet weights: offline, from a file of them
    # (saved here from the same network with random weights: the route is under test, not the accuracy).
    config = yaml.safe_load((project / "configs" / "images.yaml").read_text())
    network = config["model"]["backbone"]["init_args"]["name"]
    weights = tmp_path / "weights.pth"
    save = "import sys, timm, torch; torch.save(timm.create_model(sys.argv[1]).state_dict(), sys.argv[2])"
    run(sys.executable, "-c", save, network.split(".")[0], str(weights), cwd=tmp_path)
    fit = run(
        sys.executable, str(project / "main.py"), "fit", "--config", str(project / "configs" / "images.yaml"),
        f"--data.image_dir={photos}", f"--model.backbone.weights_path={weights}", "--data.image_size=64",
        "--data.num_workers=0", "--trainer.accelerator=cpu", "--trainer.max_epochs=2", cwd=tmp_path,
    )  # fmt: skip
    output = fit.stderr + fit.stdout
    assert "Data: packed 90 images" in output and "left out 1 unreadable images" in output
    assert "Fine-tuning 81 training images: 2 epochs of 5 steps, batch 16 (5 steps an epoch)" in output
    (run_dir,) = [p.parent for p in (tmp_path / "runs" / "images").glob("*/config.yaml")]
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["data"]["init_args"]["image_dir"] == str(photos) and saved["data"]["init_args"]["image_size"] == 64
    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    # Two epochs from random weights leave large logits: fp32 ONNX differs from PyTorch by a few 1e-3 (argmax equal).
    run(sys.executable, str(project / "export.py"), "--ckpt_path", str(checkpoint), "--max_int8_drop", "100",
        "--tolerance", "0.05", cwd=tmp_path)  # fmt: skip
    card = json.loads((checkpoint.parent / "export" / "model.card.json").read_text())
    assert card["input"]["shape"] == ["batch", 3, 64, 64] and card["class_names"] == ["cat", "dog", "red panda"]
    assert card["network"]["class_path"].endswith(".TimmNet") and card["evaluation"]["split"] == "val"

    # From scratch, the render's own network (the backbone answer) trains on the same packed images.
    scratch = run(
        sys.executable, str(project / "main.py"), "fit", "--config", str(project / "configs" / "images.yaml"),
        "--config", str(project / "configs" / "presets" / "from_scratch.yaml"), f"--data.image_dir={photos}",
        "--data.batch_size=16", "--data.num_workers=0", "--trainer.accelerator=cpu", "--trainer.max_epochs=1",
        cwd=tmp_path,
    )  # fmt: skip
    assert "Training 81 training images from scratch: 1 epoch of 5 steps" in scratch.stderr + scratch.stdout
    backbones = {yaml.safe_load(path.read_text())["model"]["backbone"]["class_path"].rsplit(".", 1)[1]
                 for path in (tmp_path / "runs" / "images").glob("*/config.yaml")}  # fmt: skip
    assert backbones == {"TimmNet", "TorchvisionNet"}

    # A photo render carries nothing of CIFAR: no config, no DataModule.
    assert (
        not list((project / "configs").glob("cifar*.yaml"))
        and not (project / "src" / package / "data" / "cifar.py").exists()
    )


def workflow_training(project: Path) -> str:
    """The render's CI step that trains in its image, each ``docker run`` made a run of this environment's Python
    in the project's folder (the image's /app holds the same files; no container engine runs these tests)."""
    workflow = yaml.safe_load((project / ".github" / "workflows" / "ci.yml").read_text())
    (step,) = [step for step in workflow["jobs"]["docker"]["steps"] if step["name"].startswith("Train in the image")]
    script, python = step["run"], sys.executable
    replacements = {
        'docker run --rm "${volumes[@]}" --entrypoint python project:ci': python,
        'docker run --rm "${volumes[@]}" project:ci': f"{python} main.py",
        "docker run --rm project:ci": f"{python} main.py",
    }
    for in_image, here in replacements.items():
        script = script.replace(in_image, here)
    assert "docker" not in script, script
    return script


def hub_cache_with_random_weights(network: str, home: Path) -> dict[str, str]:
    """A Hugging Face cache holding ``network``'s weights file (random weights: the route is under test), and the
    environment that reads it offline: what a CI runner with network access downloads into its own cache."""
    import timm
    from safetensors.torch import save_file

    repo, commit = home / "hub" / f"models--timm--{network}", "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    weights = {
        name: value.contiguous() for name, value in timm.create_model(network.split(".")[0]).state_dict().items()
    }
    save_file(weights, str(repo / "snapshots" / commit / "model.safetensors"))
    return {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1"}


@pytest.mark.parametrize("installed", RENDERS, indirect=True)
def test_rendered_project_passes_its_own_tests_and_trains(installed, tmp_path):
    project = installed
    package = next((project / "src").iterdir()).name
    dataset = json.loads((project / ".cookiecutter.json").read_text())["cookiecutter"]["dataset"]
    shown = run(sys.executable, "-m", "pip", "show", "classifier-engine", cwd=tmp_path).stdout
    assert "Version: 1." in shown  # the library, from this checkout as the render's lock says

    run_suite(project, [], OWN_SUITE_BUDGET, tmp_path / "junit.xml")
    # Its own CI's training in the image: the data it makes is its kind's, the config one it has.
    hub = {}
    if dataset == "images":
        network = yaml.safe_load((project / "configs" / "images.yaml").read_text())["model"]["backbone"]["init_args"]
        hub = hub_cache_with_random_weights(network["name"], tmp_path / "hf")
    trained = run("bash", "-euo", "pipefail", "-c", workflow_training(project), cwd=project, env=hub)
    assert "`Trainer.fit` stopped: `max_steps=1` reached." in trained.stdout + trained.stderr
    if dataset == "images":
        train_and_export_a_folder_of_photos(project, package, tmp_path)
        return

    # A tiny archive in the official on-disk format, written by the project's tests' packer.
    data_dir = tmp_path / "data"
    pack = (
        "import sys, numpy as np\n"
        "from classifier_engine.data.cifar_format import FORMATS\n"
        "from classifier_engine.testing.cifar_archives import write_archive\n"
        f"fmt = FORMATS['{dataset}']\n"
        "rng = np.random.default_rng(0)\n"
        "x = rng.integers(0, 256, (160, 3, 32, 32), dtype=np.uint8)\n"
        "y = rng.integers(0, len(fmt.class_names), 160)\n"
        "write_archive(sys.argv[1] + '/' + fmt.archive_name, fmt, x[:128], y[:128], x[128:], y[128:])\n"
    )
    data_dir.mkdir()
    run(sys.executable, "-c", pack, str(data_dir), cwd=tmp_path)

    config = project / "configs" / f"{dataset}.yaml"
    fit = run(
        sys.executable, str(project / "main.py"), "fit", "--config", str(config),
        f"--data.data_dir={data_dir}", "--data.verify_checksum=false", "--data.val_size=32",
        "--data.batch_size=32", "--data.num_workers=0", "--trainer.accelerator=cpu",
        "--trainer.max_epochs=1", "--trainer.log_every_n_steps=1",
        *(["--model.backbone.width=8"] if "FastCNN" in config.read_text() else []),
        cwd=tmp_path,
    )  # fmt: skip
    assert "`Trainer.fit` stopped: `max_epochs=1` reached." in fit.stderr + fit.stdout

    (run_dir,) = [p.parent for p in (tmp_path / "runs" / dataset).glob("*/config.yaml")]
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["data"]["init_args"]["dataset"] == dataset and saved["data"]["init_args"]["data_dir"] == str(data_dir)
    assert list(run_dir.glob("events.out.tfevents.*"))

    check = (
        "import sys, torch\n"
        f"from {package}.models import ImageClassifier\n"
        "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator\n"
        "model = ImageClassifier.load_from_checkpoint(sys.argv[1] + '/checkpoints/last.ckpt')\n"
        "print('logits', tuple(model(torch.zeros(2, 3, 32, 32, dtype=torch.uint8)).shape))\n"
        "events = EventAccumulator(sys.argv[1]); events.Reload()\n"
        "print('scalars', sorted(events.Tags()['scalars']))\n"
    )
    loaded = run(sys.executable, "-c", check, str(run_dir), cwd=tmp_path)
    num_classes = 10 if dataset == "cifar10" else 100
    assert f"logits (2, {num_classes})" in loaded.stdout
    assert "'val/top1'" in loaded.stdout and "'train/loss_step'" in loaded.stdout

    # Ship it as the rendered README says; a one-epoch model on random pixels may lose any amount to int8.
    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    run(sys.executable, str(project / "export.py"), "--ckpt_path", str(checkpoint), "--data_dir", str(data_dir),
        "--max_int8_drop", "100", cwd=tmp_path)  # fmt: skip
    card = json.loads((checkpoint.parent / "export" / "model.card.json").read_text())
    assert sorted(card["artifacts"]) == ["int8", "onnx", "pt2"] and card["evaluation"]["images"] == 32
    assert len(card["class_names"]) == num_classes and card["source"]["config_hash"].startswith(run_dir.name)
