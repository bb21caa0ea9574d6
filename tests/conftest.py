"""Render the template the way a user does, isolated from the user's cookiecutter config."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cookiecutter.main import cookiecutter

TEMPLATE = Path(__file__).resolve().parents[1]
DEFAULT_SLUG = "cifar-classifier"


@pytest.fixture
def cookiecutter_config(tmp_path: Path) -> Path:
    """A cookiecutter config that keeps clones and replay files inside the test's folder."""
    config = tmp_path / "cookiecutterrc.yaml"
    config.write_text(f"cookiecutters_dir: {tmp_path / 'clones'}\nreplay_dir: {tmp_path / 'replay'}\n")
    return config


@pytest.fixture
def bake(tmp_path: Path, cookiecutter_config: Path, monkeypatch: pytest.MonkeyPatch):
    """Render the template with ``answers`` into a fresh folder; return the project's path."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # cookiecutter leaves rendered hook copies in TMPDIR

    def _bake(template: str | Path = TEMPLATE, output: str = "out", **answers: str) -> Path:
        project = cookiecutter(
            str(template),
            no_input=True,
            extra_context=answers,
            output_dir=str(tmp_path / output),
            config_file=str(cookiecutter_config),
        )
        return Path(project)

    return _bake


def run_cookiecutter_cli(*args: str, cwd: Path, config: Path) -> subprocess.CompletedProcess:
    """``cookiecutter --no-input TEMPLATE ARGS`` in a subprocess, exactly as typed in a shell."""
    command = [sys.executable, "-m", "cookiecutter", "--no-input", "--config-file", str(config), *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)


def copy_template(work: Path) -> Path:
    """The template's current files (tracked, or new and not ignored) copied to ``work``, as a clone would have them."""
    files = (
        subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=TEMPLATE,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, files):
        if (TEMPLATE / name).is_file():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(TEMPLATE / name, work / name)
    return work


def template_as_git_repo(destination: Path) -> str:
    """A bare git repository of the template's current files, standing in for ``gh:owner/repo``."""
    work = copy_template(destination / "work")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q"], cwd=work, check=True)
    subprocess.run([*git, "add", "-A"], cwd=work, check=True)
    subprocess.run([*git, "commit", "-qm", "template"], cwd=work, check=True)
    bare = destination / "template.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True)
    return bare.as_uri()
