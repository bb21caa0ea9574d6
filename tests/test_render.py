"""Every option value renders a complete project with no template leftovers."""

from __future__ import annotations

from pathlib import Path

import tomllib

import pytest
import yaml

from .conftest import template_as_git_repo

COMMON_FILES = {
    "README.md",
    "pyproject.toml",
    "main.py",
    "export.py",
    "configs/presets/early_stopping.yaml",
    "configs/presets/ddp.yaml",
    "configs/presets/debug.yaml",
    "configs/presets/fast_dev_run.yaml",
    "scripts/slurm.sbatch",
    "tests/probes.py",
    "tests/test_ddp.py",
    "tests/__init__.py",
    "tests/conftest.py",
    "tests/test_archive.py",
    "tests/test_augment.py",
    "tests/test_callbacks.py",
    "tests/test_cifar_format.py",
    "tests/test_cli.py",
    "tests/test_datamodule.py",
    "tests/test_export.py",
    "tests/test_model.py",
}
PACKAGE_FILES = {
    "__init__.py",
    "cli.py",
    "config_hash.py",
    "callbacks/__init__.py",
    "callbacks/confusion_matrix.py",
    "callbacks/grad_scale_watchdog.py",
    "callbacks/gradient_histograms.py",
    "callbacks/model_report.py",
    "callbacks/sample_grid.py",
    "callbacks/tensorboard.py",
    "callbacks/throughput.py",
    "export/__init__.py",
    "export/flops.py",
    "export/model_card.py",
    "export/onnx_export.py",
    "data/__init__.py",
    "data/archive.py",
    "data/augment.py",
    "data/cifar_format.py",
    "data/datamodule.py",
    "data/dataset.py",
    "models/__init__.py",
    "models/backbones.py",
    "models/classifier.py",
}

# Every non-default value of every choice, alone and together (all combinations are valid).
COMBINATIONS = [
    {},
    {"dataset": "cifar100"},
    {"backbone": "resnet18"},
    {"dataset": "cifar100", "backbone": "resnet18"},
]


def expected_files(import_name: str, dataset: str) -> set[str]:
    package = {f"src/{import_name}/{name}" for name in PACKAGE_FILES}
    return COMMON_FILES | package | {f"configs/{dataset}.yaml"}


def rendered_files(project: Path) -> set[str]:
    return {str(p.relative_to(project)) for p in project.rglob("*") if p.is_file()}


@pytest.mark.parametrize("answers", COMBINATIONS, ids=lambda a: "-".join(a.values()) or "defaults")
def test_render_gives_exactly_the_expected_files(bake, answers):
    project = bake(**answers)
    assert project.name == "cifar-classifier"
    dataset = answers.get("dataset", "cifar10")
    assert rendered_files(project) == expected_files("cifar_classifier", dataset)

    for name in sorted(rendered_files(project)):
        text = (project / name).read_text()
        for leftover in ("{{", "{%", "cookiecutter"):
            assert leftover not in text, f"{leftover!r} left in {name}"
        if name.endswith(".py"):
            compile(text, name, "exec")
        if name.endswith(".yaml"):
            yaml.safe_load(text)

    config = yaml.safe_load((project / "configs" / f"{dataset}.yaml").read_text())
    assert config["data"]["dataset"] == dataset
    assert config["model"]["backbone"] == answers.get("backbone", "fastcnn")
    assert config["trainer"]["logger"]["init_args"]["name"] == dataset


def test_names_are_derived_and_overridable(bake):
    derived = bake(project_name="Deep Birds 2")
    assert derived.name == "deep-birds-2" and (derived / "src" / "deep_birds_2" / "cli.py").is_file()
    chosen = bake(output="other", project_name="Deep Birds 2", project_slug="birds", import_name="aves")
    assert chosen.name == "birds" and (chosen / "src" / "aves" / "cli.py").is_file()
    assert "from aves.cli import TrainerCLI" in (chosen / "main.py").read_text()
    pyproject = (chosen / "pyproject.toml").read_text()
    assert 'name = "birds"' in pyproject


def test_free_text_answers_stay_text(bake):
    tricky = 'Ann "The Coder" O\'Neil \\ <x>'
    project = bake(author=tricky, description='Says "hi"\\n and {braces}')

    meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    assert meta["authors"][0]["name"] == tricky
    assert meta["description"] == 'Says "hi"\\n and {braces}'


def test_renders_from_a_git_url_as_from_a_local_path(bake, tmp_path):
    url = template_as_git_repo(tmp_path / "remote")
    from_git = bake(template=url, output="from-git")
    from_path = bake(output="from-path")
    files = rendered_files(from_path)
    assert rendered_files(from_git) == files
    for name in files:
        assert (from_git / name).read_bytes() == (from_path / name).read_bytes(), name
