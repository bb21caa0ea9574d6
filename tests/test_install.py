"""The rendered project installs wherever it claims: its locks resolve for every supported Python and system.

Resolutions use uv against the package index (metadata only, nothing is downloaded or built),
with ``--only-binary`` so that a pin without a wheel for a target fails here rather than there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

CLAIMED_PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
# torch 2.14's wheels start at macOS 14 on Apple silicon.
TARGETS = {"linux": "x86_64-unknown-linux-gnu", "macos": "aarch64-apple-darwin", "windows": "x86_64-pc-windows-msvc"}
CUDA_PACKAGES = ("nvidia-", "cuda-", "triton")


def pins(path: Path) -> list[Requirement]:
    return [Requirement(line) for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    from cookiecutter.main import cookiecutter

    from .conftest import TEMPLATE

    output = tmp_path_factory.mktemp("install")
    config = output / "cookiecutterrc.yaml"
    config.write_text(f"cookiecutters_dir: {output / 'clones'}\nreplay_dir: {output / 'replay'}\n")
    return Path(cookiecutter(str(TEMPLATE), no_input=True, output_dir=str(output), config_file=str(config)))


def test_the_workflow_tests_every_claimed_python_with_the_cpu_lock(project):
    workflow = yaml.safe_load((project / ".github" / "workflows" / "ci.yml").read_text())
    job = workflow["jobs"]["test"]
    assert job["strategy"]["matrix"]["python-version"] == CLAIMED_PYTHONS
    installs = [line for step in job["steps"] for line in step.get("run", "").splitlines() if "pip install" in line]
    project_install = [line for line in installs if "-e " in line]
    assert len(project_install) == 1 and "-c constraints-cpu.txt" in project_install[0]
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in project_install[0]
    others = [line for line in installs if line not in project_install]
    assert not [line for line in others if "torch" in line]  # no unpinned torch slipped in beside the lock


def test_the_cpu_lock_is_the_lock_without_cuda(project):
    full = {(r.name, str(r.marker)): r for r in pins(project / "constraints.txt")}
    cpu = {(r.name, str(r.marker)): r for r in pins(project / "constraints-cpu.txt")}
    assert not [name for name, _ in cpu if name.startswith(CUDA_PACKAGES)]
    for key, requirement in cpu.items():
        if requirement.name not in ("torch", "torchvision"):
            assert full[key].specifier == requirement.specifier, key  # every other pin is the same
    for name in ("torch", "torchvision"):
        (version,) = [str(r.specifier).removeprefix("==") for r in full.values() if r.name == name]
        on_linux = [r for r in cpu.values() if r.name == name and r.marker.evaluate({"sys_platform": "linux"})]
        elsewhere = [r for r in cpu.values() if r.name == name and r.marker.evaluate({"sys_platform": "darwin"})]
        assert [str(r.specifier) for r in on_linux] == [f"=={version}+cpu"]
        assert [str(r.specifier) for r in elsewhere] == [f"=={version}"]


@pytest.fixture(scope="module")
def lock_with_built_library(project, tmp_path_factory) -> Path:
    """The lock with classifier-engine as its built wheel (pure Python) in place of its source folder.

    ``--only-binary :all:`` below refuses to build anything, the library included: its wheel is what every
    platform installs.
    """
    from .conftest import TEMPLATE

    dist = tmp_path_factory.mktemp("dist")
    build = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist)]
    subprocess.run([*build, str(TEMPLATE / "classifier-engine")], check=True, capture_output=True, timeout=300)
    (wheel,) = dist.glob("classifier_engine-*-py3-none-any.whl")
    lines = (project / "constraints.txt").read_text().splitlines()
    source = [index for index, line in enumerate(lines) if line.startswith("classifier-engine @ ")]
    assert len(source) == 1
    lines[source[0]] = f"classifier-engine @ {wheel.as_uri()}"
    lock = dist / "constraints.txt"
    lock.write_text("\n".join(lines) + "\n")
    return lock


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("python", CLAIMED_PYTHONS)
def test_the_lock_resolves_for_every_claimed_python_and_system(project, lock_with_built_library, python, target):
    command = [sys.executable, "-m", "uv", "pip", "compile", "pyproject.toml", "--extra", "dev"]
    command += ["-c", str(lock_with_built_library), "--python-version", python, "--python-platform", TARGETS[target]]
    command += ["--only-binary", ":all:", "--no-header", "--quiet", "--output-file", os.devnull]
    env = {**os.environ, "MACOSX_DEPLOYMENT_TARGET": "14.0"}
    result = subprocess.run(command, cwd=project, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_lock_script_reproduces_the_committed_lock(project, tmp_path):
    # Resolution equals the files, not only "it resolves": the script keeps the current pins unless told to upgrade.
    copy = tmp_path / "project"
    shutil.copytree(project, copy)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}  # this uv
    result = subprocess.run(["bash", "scripts/lock.sh"], cwd=copy, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    for lock in ("constraints.txt", "constraints-cpu.txt"):
        assert (copy / lock).read_text() == (project / lock).read_text(), f"scripts/lock.sh changed {lock}"
    assert sorted(p.name for p in copy.iterdir()) == sorted(p.name for p in project.iterdir())  # no leftover


def test_one_command_moves_the_engine_release_and_both_locks(project, tmp_path):
    copy = tmp_path / "project"
    shutil.copytree(project, copy)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}  # this uv
    lines = (project / "constraints.txt").read_text().splitlines()
    (pin,) = [line for line in lines if line.startswith("classifier-engine==")]
    (source,) = [line for line in lines if line.startswith("classifier-engine @ ")]
    # The same release from the same source: the locks stay as they are, byte for byte.
    command = ["bash", "scripts/upgrade_engine.sh", pin.split("==")[1], source.split(" @ ")[1]]
    result = subprocess.run(command, cwd=copy, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    for lock in ("constraints.txt", "constraints-cpu.txt"):
        assert (copy / lock).read_text() == (project / lock).read_text(), lock
    # A release that does not exist anywhere is refused by the resolver, and says so.
    result = subprocess.run(["bash", "scripts/upgrade_engine.sh", "1.99.0"], cwd=copy, capture_output=True, text=True,
                            timeout=600, env=env)  # fmt: skip
    assert result.returncode != 0 and "classifier-engine" in result.stderr
    for lock in ("constraints.txt", "constraints-cpu.txt"):
        assert (copy / lock).read_text() == (project / lock).read_text(), f"a refused upgrade changed {lock}"
    assert sorted(p.name for p in copy.iterdir()) == sorted(p.name for p in project.iterdir())  # no leftover
