"""Answers that would render a broken or dangerous project are refused, leaving nothing behind."""

from __future__ import annotations

import pytest

from .conftest import TEMPLATE, run_cookiecutter_cli

REFUSED = [
    ("import_name=9lives", "not a valid lowercase Python identifier"),
    ("import_name=my-project", "not a valid lowercase Python identifier"),
    ("import_name=class", "is a Python keyword"),
    ("import_name=torch", "would shadow the package 'torch'"),
    ("import_name=lightning", "would shadow the package 'lightning'"),
    ("import_name=json", "would shadow the package 'json'"),
    ("project_slug=.hidden", "is not a usable folder name"),
    ("project_slug=a b", "is not a usable folder name"),
]


@pytest.mark.parametrize(("answer", "message"), REFUSED, ids=[a for a, _ in REFUSED])
def test_refused_answer_exits_with_a_clear_message_and_no_output(tmp_path, cookiecutter_config, answer, message):
    out = tmp_path / "out"
    result = run_cookiecutter_cli(str(TEMPLATE), "-o", str(out), answer, cwd=tmp_path, config=cookiecutter_config)
    assert result.returncode != 0
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("ERROR: ")]
    assert len(error_lines) == 1 and message in error_lines[0], result.stderr
    assert "pass e.g." in error_lines[0] or "pick another name" in error_lines[0]
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize(
    "payload",
    [
        'x"); import pathlib; pathlib.Path("PWNED").touch(); ("',
        "x'''); import pathlib; pathlib.Path('PWNED').touch(); ('''",
        'x"""); import pathlib; pathlib.Path("PWNED").touch(); ("""',
    ],
)
def test_answers_are_never_executed(tmp_path, cookiecutter_config, payload):
    # The payload would write outside the output folder, which cookiecutter deletes when a hook refuses.
    marker = tmp_path / "PWNED"
    payload = payload.replace("PWNED", str(marker))
    for key in ("import_name", "author", "project_slug"):
        out = tmp_path / f"out-{key}"
        result = run_cookiecutter_cli(
            str(TEMPLATE), "-o", str(out), f"{key}={payload}", cwd=tmp_path, config=cookiecutter_config
        )
        rendered = out.is_dir() and any(out.iterdir())
        refused_by_hook = "ERROR: " in result.stderr
        assert rendered or refused_by_hook, f"{key}: the hooks did not run\n{result.stderr[-2000:]}"
        assert not marker.exists(), f"{key}: the answer was executed"


def test_a_valid_render_prints_the_next_commands(tmp_path, cookiecutter_config):
    result = run_cookiecutter_cli(
        str(TEMPLATE), "-o", str(tmp_path / "out"), "dataset=cifar100", cwd=tmp_path, config=cookiecutter_config
    )
    assert result.returncode == 0, result.stderr
    # On stderr: stdout stays free for tools that print a diff of renders there (cruft diff).
    assert "python main.py fit --config configs/cifar100.yaml" in result.stderr and result.stdout == ""
    assert 'pip install -c constraints.txt -e ".[dev]"' in result.stderr  # as the README installs
