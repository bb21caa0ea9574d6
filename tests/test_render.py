"""Every option value renders a complete project with no template leftovers."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from cookiecutter.main import cookiecutter
from packaging.requirements import Requirement

from .conftest import TEMPLATE, template_as_git_repo

# The library's version, as its pyproject.toml states it.
LIBRARY_VERSION = tomllib.loads((TEMPLATE / "classifier-engine" / "pyproject.toml").read_text())["project"]["version"]

# The answers record (cookiecutter's replay format) and the docs on updating from the template name
# cookiecutter on purpose; elsewhere the word would be a leftover.
DOCUMENTS_THE_RENDER = {".cookiecutter.json", "README.md", "docs/tests.md"}
TEMPLATE_VARIABLE = re.compile(r"(?<![.\w])cookiecutter\.(?!json)\w")
GITHUB_EXPRESSION = re.compile(r"\$\{\{[^}]*\}\}")
SHA_PIN = re.compile(r"^\s*(?:- )?uses: [\w.-]+/[\w.-]+@[0-9a-f]{40} # v\d", re.MULTILINE)

COMMON_FILES = {
    ".cookiecutter.json",
    ".github/workflows/ci.yml",
    ".gitignore",
    ".pre-commit-config.yaml",
    "CONTRIBUTING.md",
    "SECURITY.md",
    "constraints.txt",
    "constraints-cpu.txt",
    "README.md",
    "docs/benchmarks.md",
    "docs/cluster.md",
    "docs/configuration.md",
    "docs/data_and_speed.md",
    "docs/design_decisions.md",
    "docs/install.md",
    "docs/labels.md",
    "docs/logging.md",
    "docs/report.md",
    "docs/images/report.png",
    "docs/runs.md",
    "docs/shipping.md",
    "docs/sweeps.md",
    "docs/tests.md",
    "docs/tracking.md",
    "docs/upgrading.md",
    "docs/cross_validation.md",
    "pyproject.toml",
    "main.py",
    "export.py",
    "sweep.py",
    "check_labels.py",
    "cross_validate.py",
    "serve.py",
    "configs/presets/early_stopping.yaml",
    "configs/presets/ddp.yaml",
    "configs/presets/debug.yaml",
    "configs/presets/fast_dev_run.yaml",
    "configs/presets/step_checkpoints.yaml",
    "configs/presets/mlflow.yaml",
    "configs/presets/wandb.yaml",
    "scripts/lock.sh",
    "scripts/upgrade_engine.sh",
    "scripts/kubeflow_trainjob.yaml",
    "scripts/serve_kubernetes.yaml",
    "Dockerfile",
    ".dockerignore",
    "scripts/slurm.sbatch",
    "scripts/sweep_array.sbatch",
    "scripts/cross_validate_array.sbatch",
    "scripts/tensorboard_screenshots.py",
    "scripts/tensorrt_engine.sh",
    "scripts/torchrun.sh",
    "tests/__init__.py",
    "tests/conftest.py",
    "tests/test_callbacks.py",
    "tests/test_model.py",
    "tests/test_walk.py",
}
PACKAGE_FILES = {
    "__init__.py",
    "callbacks/__init__.py",
    "callbacks/grad_scale_watchdog.py",
    "callbacks/gradient_histograms.py",
    "data/__init__.py",
    "models/__init__.py",
    "models/backbones.py",
    "models/classifier.py",
    "models/schedules.py",
    "models/test_time.py",
}
# What only one kind of render holds: a photo render has no CIFAR file, a CIFAR render no photo-folder file.
ONLY_FOR = {
    "images": {
        "pack.py",
        "docs/own_data.md",
        "configs/images.yaml",
        "configs/presets/from_scratch.yaml",
        "configs/presets/streaming.yaml",
        "src/{package}/data/photos.py",
        "src/{package}/callbacks/freeze_backbone.py",  # the fine-tune's parts
        "src/{package}/callbacks/weight_averaging.py",
    },
    "cifar": {
        "configs/cifar10_fast.yaml",
        "src/{package}/data/cifar.py",
        "src/{package}/callbacks/lookahead.py",  # the fast recipe's parts
        "src/{package}/callbacks/whitening.py",
        "tests/test_airbench.py",
    },
}


# Every non-default value of every choice, alone and together (all combinations are valid).
COMBINATIONS = [
    {},
    {"dataset": "cifar100"},
    {"backbone": "resnet18"},
    {"dataset": "cifar100", "backbone": "resnet18"},
    {"dataset": "images"},
    {"dataset": "images", "backbone": "resnet18"},
]


def expected_files(import_name: str, dataset: str) -> set[str]:
    package = {f"src/{import_name}/{name}" for name in PACKAGE_FILES}
    own = {name.format(package=import_name) for name in ONLY_FOR["images" if dataset == "images" else "cifar"]}
    configs = {f"configs/{dataset}.yaml", f"configs/sweeps/{dataset}.yaml"}
    return COMMON_FILES | package | own | configs


def rendered_files(project: Path) -> set[str]:
    return {str(p.relative_to(project)) for p in project.rglob("*") if p.is_file()}


@pytest.mark.parametrize("answers", COMBINATIONS, ids=lambda a: "-".join(a.values()) or "defaults")
def test_render_gives_exactly_the_expected_files(bake, answers):
    project = bake(**answers)
    dataset = answers.get("dataset", "cifar10")
    assert project.name == ("photo-classifier" if dataset == "images" else "cifar-classifier")
    assert rendered_files(project) == expected_files(project.name.replace("-", "_"), dataset)

    for name in sorted(rendered_files(project)):
        if name.endswith(".png"):  # the docs' pictures, copied as they are
            continue
        text = GITHUB_EXPRESSION.sub("", (project / name).read_text())  # GitHub's own ${{ }} are meant to stay
        for leftover in ("{{", "{%"):
            assert leftover not in text, f"{leftover!r} left in {name}"
        if name in DOCUMENTS_THE_RENDER:
            assert not TEMPLATE_VARIABLE.search(text), f"a template variable is left in {name}"
        else:
            assert "cookiecutter" not in text, f"'cookiecutter' left in {name}"
        if name.endswith(".py"):
            compile(text, name, "exec")
        if name.endswith(".yaml"):
            list(yaml.safe_load_all(text))  # a manifest may hold several documents

    default = yaml.safe_load((project / "configs" / f"{dataset}.yaml").read_text())
    assert default["trainer"]["logger"]["init_args"]["name"] == dataset
    assert f'/ "configs" / "{dataset}.yaml"' in (project / "main.py").read_text()  # what every command starts from
    networks = {
        ("cifar", "fastcnn"): ("{package}.models.backbones.FastCNN", {"width": 64}),
        ("cifar", "resnet18"): ("{package}.models.backbones.CifarResNet", {"depth": 18}),
        ("images", "fastcnn"): ("{package}.models.backbones.FastCNN", {"width": 64}),
        ("images", "resnet18"): ("classifier_engine.TorchvisionNet", {"name": "resnet18"}),
    }
    # The backbone answer is the network trained from scratch: the CIFAR configs' and the photos' from-scratch preset's.
    # The photo config itself fine-tunes the same pretrained timm network in every render.
    package = project.name.replace("-", "_")
    if dataset == "images":
        assert default["data"]["class_path"] == f"{package}.data.PhotoDataModule"
        scratch = yaml.safe_load((project / "configs" / "presets" / "from_scratch.yaml").read_text())
        network, settings = networks["images", answers.get("backbone", "fastcnn")]
        assert scratch["model"]["backbone"] == {"class_path": network.format(package=package), "init_args": settings}
        assert default["model"]["backbone"]["class_path"] == f"{package}.models.backbones.TimmNet"
        assert default["model"]["backbone"]["init_args"]["name"] == "tf_efficientnet_lite1.in1k"
    else:
        assert default["data"]["class_path"] == f"{package}.data.CifarDataModule"
        assert default["data"]["init_args"]["dataset"] == dataset
        network, settings = networks["cifar", answers.get("backbone", "fastcnn")]
        assert default["model"]["backbone"] == {
            "class_path": network.format(package=package),
            "init_args": settings,
        }


def test_names_are_derived_and_overridable(bake):
    derived = bake(project_name="Deep Birds 2")
    assert derived.name == "deep-birds-2" and (derived / "src" / "deep_birds_2" / "models" / "classifier.py").is_file()
    chosen = bake(output="other", project_name="Deep Birds 2", project_slug="birds", import_name="aves")
    assert chosen.name == "birds" and (chosen / "src" / "aves" / "models" / "classifier.py").is_file()
    assert "from aves.models import ImageClassifier" in (chosen / "main.py").read_text()
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
    locks = {"constraints.txt", "constraints-cpu.txt"}
    for name in files - locks:
        assert (from_git / name).read_bytes() == (from_path / name).read_bytes(), name
    # The library comes from where the template came from: this checkout (offline), or the same git commit.
    commit = subprocess.run(["git", "ls-remote", url, "HEAD"], capture_output=True, text=True, check=True).stdout[:40]
    sources = {
        from_path: f"classifier-engine @ {(TEMPLATE / 'classifier-engine').as_uri()}",
        from_git: f"classifier-engine @ git+{url}@{commit}#subdirectory=classifier-engine",
    }
    for project, source in sources.items():
        for lock in locks:
            lines = (project / lock).read_text().splitlines()
            assert lines[lines.index(source) - 1] == f"classifier-engine=={LIBRARY_VERSION}", (project, lock)
            assert sum(line.startswith("classifier-engine") for line in lines) == 2
    # pip finds the library at that commit (it clones and reads its metadata; nothing is installed).
    found = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-build-isolation", "--report", "-",
         "-q", sources[from_git]],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert found.returncode == 0, found.stderr[-2000:]
    assert json.loads(found.stdout)["install"][0]["metadata"]["version"] == LIBRARY_VERSION


@pytest.mark.parametrize("answers", COMBINATIONS, ids=lambda a: "-".join(a.values()) or "defaults")
def test_rendered_code_passes_its_own_lint_and_format(bake, answers):
    project = bake(**answers, import_name="a_forty_character_import_name_for_tests")  # the longest allowed
    for command in (["check", "."], ["format", "--check", "."]):
        result = subprocess.run([sys.executable, "-m", "ruff", *command], cwd=project, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dataset", ["cifar10", "cifar100", "images"])
def test_ci_workflow_keeps_github_expressions_and_is_locked_down(bake, dataset):
    project = bake(dataset=dataset)
    text = (project / ".github" / "workflows" / "ci.yml").read_text()
    workflow = yaml.safe_load(text)
    assert "${{ matrix.python-version }}" in text and "${{ github.ref }}" in text
    assert workflow["permissions"] == {"contents": "read"}
    every_step = [step for job in workflow["jobs"].values() for step in job["steps"]]
    uses = [step["uses"] for step in every_step if "uses" in step]
    assert uses and len(SHA_PIN.findall(text)) == len(uses)  # every action pinned to a commit SHA
    checkouts = [step for step in every_step if step.get("uses", "").startswith("actions/checkout@")]
    assert all(checkout["with"]["persist-credentials"] is False for checkout in checkouts)
    run = "\n".join(step.get("run", "") for step in workflow["jobs"]["test"]["steps"])
    assert "ruff check" in run and "ruff format --check" in run
    assert 'pytest -m "slow or not slow"' in run  # a plain pytest is the quick tier; the workflow runs everything
    # The image is built there for real (no container engine runs the template's tests) and trained in.
    docker = "\n".join(step.get("run", "") for step in workflow["jobs"]["docker"]["steps"])
    assert "docker build -t project:ci --build-arg LOCK=constraints-cpu.txt" in docker
    assert f"project:ci fit --config configs/{dataset}.yaml" in docker and "--trainer.fast_dev_run true" in docker
    assert (project / "configs" / f"{dataset}.yaml").is_file()  # the render's own config (test_bake_and_train runs it)


def test_constraints_pin_every_dependency(bake):
    project = bake()
    pinned = {}
    for line in (project / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            requirement = Requirement(line)  # name==version, with an environment marker where versions differ
            if requirement.url:  # where the library comes from, beside its pinned version
                continue
            pinned[requirement.name.lower().replace("_", "-")] = str(requirement.specifier).removeprefix("==")
    meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    extras = [requirement for group in meta["optional-dependencies"].values() for requirement in group]
    for requirement in [*meta["dependencies"], *extras]:
        name = re.split(r"[<>=!\[ ;]", requirement, maxsplit=1)[0].lower().replace("_", "-")
        if name != meta["name"]:  # dev names the project's own extras (sweep, mlflow, wandb)
            assert name in pinned, f"{name} is not pinned in constraints.txt"
    assert pinned["torch"] == "2.14.1" and pinned["torchvision"] == "0.29.1"
    # The library: a compatible range in pyproject.toml (every extra too), the release it was rendered with in
    # both locks.
    assert pinned["classifier-engine"] == LIBRARY_VERSION
    engine = [Requirement(r) for r in [*meta["dependencies"], *extras] if Requirement(r).name == "classifier-engine"]
    major, minor = LIBRARY_VERSION.split(".")[:2]
    assert len(engine) == 7 and {str(r.specifier) for r in engine} == {f"<{int(major) + 1},>={major}.{minor}"}
    cpu = (project / "constraints-cpu.txt").read_text().splitlines()
    assert f"classifier-engine=={LIBRARY_VERSION}" in cpu


def test_lightning_requirement_refuses_the_compromised_releases(bake):
    # lightning 2.6.2 and 2.6.3 on PyPI carried malicious code (advisory GHSA-w37p-236h-pfx3).
    meta = tomllib.loads((bake() / "pyproject.toml").read_text())["project"]
    (lightning,) = [Requirement(r) for r in meta["dependencies"] if Requirement(r).name == "lightning"]
    assert not {"2.6.2", "2.6.3"} & set(lightning.specifier.filter(["2.6.2", "2.6.3"]))
    assert lightning.specifier.contains("2.6.6")
    assert not lightning.specifier.contains("2.6.5")  # before 2.6.6 a checkpoint could run code (GHSA-qqmf-gpg7-g8gw)
    (engine,) = [Requirement(r) for r in meta["dependencies"] if Requirement(r).name == "classifier-engine"]
    assert engine.specifier.contains(LIBRARY_VERSION) and not engine.specifier.contains("2.0.0")  # a range: 1.x


def test_recorded_answers_re_render_the_same_tree(bake, tmp_path, cookiecutter_config):
    answers = {"project_name": "Replay Me", "author": 'Ann "A" O\'Neil', "dataset": "cifar100", "backbone": "resnet18"}
    project = bake(**answers)
    recorded = json.loads((project / ".cookiecutter.json").read_text())["cookiecutter"]
    assert {key: recorded[key] for key in answers} == answers
    again = Path(
        cookiecutter(
            str(TEMPLATE),
            replay=str(project / ".cookiecutter.json"),
            output_dir=str(tmp_path / "replayed"),
            config_file=str(cookiecutter_config),
        )
    )
    files = rendered_files(project)
    assert rendered_files(again) == files
    for name in files:
        assert (again / name).read_bytes() == (project / name).read_bytes(), name


# A render's wings, lowest first: a module imports only its own wing or a lower one. The user's data and models
# do not import each other; callbacks may use both. (The library's rooms hold their own rules, each in its
# README, checked by the library's tests: classifier-engine/tests/test_rooms.py.)
WING_LEVELS = {"data": 0, "models": 0, "callbacks": 1}


def package_imports(package: Path, wings: dict[str, int] = WING_LEVELS) -> list[tuple[str, str, str]]:
    """(importing file, its wing, imported wing) for every import of the package's own modules."""
    import ast

    found = []
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).parts
        if len(parts) < 2:
            continue
        wing, module = parts[0], [package.name, *(p.removesuffix(".py") for p in parts)]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:  # relative to the module's own package
                    base = module[: len(module) - node.level]
                    target = [*base, *(node.module or "").split(".")] if node.module else base
                else:
                    target = (node.module or "").split(".")
                names = [target]
            elif isinstance(node, ast.Import):
                names = [alias.name.split(".") for alias in node.names]
            else:
                continue
            for name in names:
                if len(name) > 1 and name[0] == package.name and name[1] in wings:
                    found.append((str(path.relative_to(package)), wing, name[1]))
    return found


@pytest.mark.parametrize("dataset", ["cifar10", "images"])
def test_every_import_of_the_package_runs_one_way(bake, dataset):
    package = next((bake(dataset=dataset) / "src").iterdir())
    imports = package_imports(package)
    assert {imported for _, _, imported in imports} >= {"models"}  # the check sees the package's own imports
    upward = [
        (path, imported)
        for path, wing, imported in imports
        if wing != imported and WING_LEVELS[imported] >= WING_LEVELS[wing]
    ]
    assert upward == []


def test_the_library_never_imports_a_project():
    library = TEMPLATE / "classifier-engine" / "src" / "classifier_engine"
    for path in library.rglob("*.py"):  # no template variable, no project's package
        text = path.read_text()
        assert "cookiecutter" not in text and "{{" not in text, path
        assert not re.search(r"^\s*(from|import) (cifar|photo)_classifier", text, re.MULTILINE), path


@pytest.mark.parametrize("dataset", ["cifar10", "images"])
def test_the_docs_name_what_a_user_edits_with_its_true_length(bake, dataset):
    project = bake(dataset=dataset)
    package = next((project / "src").iterdir())
    page = (project / "docs" / "configuration.md").read_text()
    table = page.split("## What you edit", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `([^`]+)` \| (\d+) \|", table, flags=re.MULTILINE))
    listed = {path for pattern in rows for path in package.glob(pattern) if path.name != "__init__.py"}
    user_wing = {path for wing in ("models", "data", "callbacks") for path in (package / wing).glob("*.py")}
    assert listed == {path for path in user_wing if path.name != "__init__.py"}  # every file, nothing else
    for pattern, lines in rows.items():
        files = [path for path in package.glob(pattern) if path.name != "__init__.py"]
        assert int(lines) == sum(len(path.read_text().splitlines()) for path in files), pattern


def test_an_images_render_speaks_of_the_users_photos(bake):
    project = bake(dataset="images")
    assert project.name == "photo-classifier"
    readme, pyproject = (project / "README.md").read_text(), (project / "pyproject.toml").read_text()
    assert readme.startswith("# Photo Classifier\n\nImage classification of your own photos")
    assert 'description = "Image classification of your own photos' in pyproject


def public_api() -> set[str]:
    """The names ``classifier_engine`` exports (its ``_API`` table), read without importing it."""
    import ast

    source = (TEMPLATE / "classifier-engine" / "src" / "classifier_engine" / "__init__.py").read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "_API":
            return {key.value for key in node.value.keys} | {"__version__"}
    raise AssertionError("classifier_engine/__init__.py has no _API table")


def library_uses(path: Path) -> list[str]:
    """Each library name a file reaches: ``classifier_engine.X`` for a public X, else the module it goes through."""
    import ast

    tree = ast.parse(path.read_text())
    aliases = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
               for alias in node.names if alias.name == "classifier_engine"}  # fmt: skip
    used = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "classifier_engine":
            if node.module == "classifier_engine":
                used += [f"classifier_engine.{alias.name}" for alias in node.names]
            elif node.module != "classifier_engine.testing":  # public too: tiny data for tests
                used.append(f"module {node.module}")
        elif isinstance(node, ast.Import):
            used += [f"module {a.name}" for a in node.names if a.name.startswith("classifier_engine.")]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            used.append(f"classifier_engine.{node.attr}")
    return used


@pytest.mark.parametrize("dataset", ["cifar10", "images"])
def test_a_render_reaches_the_library_through_its_public_api_only(bake, dataset):
    project, api = bake(dataset=dataset), public_api()
    uses = {(str(path.relative_to(project)), name) for path in project.rglob("*.py") for name in library_uses(path)}
    assert {name for _, name in uses} >= {"classifier_engine.run_main", "classifier_engine.Normalize"}  # it sees them
    outside = sorted((path, name) for path, name in uses if name.removeprefix("classifier_engine.") not in api)
    assert outside == []


@pytest.mark.parametrize("dataset", ["cifar10", "images"])
def test_a_render_is_code_a_user_reads_whole(bake, dataset):
    package = next((bake(dataset=dataset) / "src").iterdir())
    lines = {path.name: len(path.read_text().splitlines()) for path in package.rglob("*.py")}
    assert sum(lines.values()) <= 1800
    assert lines["classifier.py"] <= 200


def test_the_post_gen_hook_prunes_only_files_a_render_has(bake):
    import ast

    source = (TEMPLATE / "hooks" / "post_gen_project.py").read_text()
    (only_for,) = [node.value for node in ast.parse(source).body
                   if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "ONLY_FOR"]  # fmt: skip
    for kind, paths in ast.literal_eval(only_for).items():
        project = bake(dataset="images" if kind == "images" else "cifar10")  # a render keeps its own kind's files
        package = next((project / "src").iterdir()).name
        assert len(paths) >= 3
        assert [path for path in paths if not (project / path.format(import_name=package)).is_file()] == []


@pytest.mark.parametrize("dataset", ["cifar10", "images"])
def test_every_config_a_render_s_docs_name_is_in_that_render(bake, dataset):
    project = bake(dataset=dataset)
    pages = [project / "README.md", *(project / "docs").glob("*.md")]
    named = set()
    for page in pages:
        text = page.read_text()
        written = set(re.findall(r"^# (configs/[\w./-]+\.ya?ml):", text, flags=re.MULTILINE))  # a file the page shows
        named |= {(page.name, path) for path in re.findall(r"\bconfigs/[\w./-]+\.ya?ml", text) if path not in written}
    assert len(named) > 5
    missing = sorted(f"{page}: {path}" for page, path in named if not (project / path).is_file())
    assert missing == []


@pytest.mark.parametrize("dataset", ["cifar10", "images"])
def test_every_library_page_a_render_s_docs_point_to_is_installed_with_the_library(bake, dataset):
    """A render's page hands its depth to ``python -m classifier_engine.docs PAGE``: that page must exist,
    and it must read for any project (no template syntax, no page of a render linked as if beside it)."""
    project = bake(dataset=dataset)
    library_docs = TEMPLATE / "classifier-engine" / "src" / "classifier_engine" / "docs"
    texts = [(project / "README.md").read_text(), *(page.read_text() for page in (project / "docs").glob("*.md"))]
    pointed = {name for text in texts for name in re.findall(r"python -m classifier_engine\.docs\s+(\w+)", text)}
    assert {"runs", "cluster", "shipping", "report", "benchmarks"} <= pointed
    assert sorted(name for name in pointed if not (library_docs / f"{name}.md").is_file()) == []
    render_pages = {page.name for page in (project / "docs").glob("*.md")}
    for page in library_docs.glob("*.md"):
        text = page.read_text()
        assert "{{" not in text and "{%" not in text, page.name
        links = set(re.findall(r"\]\(([\w-]+\.md)", text))
        assert sorted(link for link in links if not (library_docs / link).is_file()) == [], page.name
    assert render_pages >= {"runs.md", "cluster.md", "shipping.md", "report.md", "benchmarks.md"}
