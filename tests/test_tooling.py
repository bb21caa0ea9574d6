"""The template's own code (hooks and tests) passes the same lint and format checks it ships."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import TEMPLATE


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_template_code_is_clean(command):
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "hooks", "tests"], cwd=TEMPLATE, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
