"""A rendered project follows its template with cruft: local edits kept, dropped files removed, one clean diff."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import template_as_git_repo

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main"]
CRUFT = [sys.executable, "-m", "cruft"]


def run(*command: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(list(command), cwd=cwd, capture_output=True, text=True, timeout=300)


def commit(repo: Path, message: str) -> str:
    run(*GIT, "add", "-A", cwd=repo)
    assert run(*GIT, "commit", "-qm", message, cwd=repo).returncode == 0
    return run("git", "rev-parse", "HEAD", cwd=repo).stdout.strip()


@pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for template commits")
def test_cruft_moves_a_project_to_the_next_template_commit(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # renders leave hook copies there
    url = template_as_git_repo(tmp_path)  # tmp_path/work is its working copy
    created = run(*CRUFT, "create", "--no-input", "--output-dir", str(tmp_path / "out"), url, cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    project = tmp_path / "out" / "cifar-classifier"
    run(*GIT, "init", "-q", cwd=project)
    commit(project, "rendered")
    readme = project / "README.md"
    readme.write_text(readme.read_text() + "\nOur lab's notes.\n")  # a local edit of a template file
    commit(project, "local notes")
    assert run(*CRUFT, "check", cwd=project).returncode == 0

    # The template moves on: it drops a preset and changes a file the project did not touch.
    template = tmp_path / "work" / "{{cookiecutter.project_slug}}"
    (template / "configs" / "presets" / "fast_dev_run.yaml").unlink()
    contributing = template / "CONTRIBUTING.md"
    contributing.write_text(contributing.read_text() + "\nA new rule.\n")
    new_commit = commit(tmp_path / "work", "template v2")
    assert run("git", "push", "-q", url, "main", cwd=tmp_path / "work").returncode == 0

    assert run(*CRUFT, "check", cwd=project).returncode == 1  # behind its template
    diff = run(*CRUFT, "diff", "--exit-code", cwd=project)
    assert diff.returncode == 1 and diff.stdout.startswith("diff --git")
    assert "Rendered" not in diff.stdout  # the template's next-steps message stays out of the diff

    updated = run(*CRUFT, "update", "--skip-apply-ask", "--allow-untracked-files", "-y", cwd=project)
    assert updated.returncode == 0, updated.stdout + updated.stderr
    assert "Our lab's notes." in readme.read_text()  # kept
    assert not (project / "configs" / "presets" / "fast_dev_run.yaml").exists()  # removed with the template
    assert "A new rule." in (project / "CONTRIBUTING.md").read_text()  # applied
    assert json.loads((project / ".cruft.json").read_text())["commit"] == new_commit
    assert run(*CRUFT, "check", cwd=project).returncode == 0
