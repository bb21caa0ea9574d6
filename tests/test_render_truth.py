"""Every render is true to itself: each file, command, module and library name its text gives exists in that render,
or is a public name of the library it installs, and its pages speak only of what its kind has.

The text is every file a user reads: the README and the other pages, ``docs/``, ``scripts/``, the workflows, the
``Dockerfile``, the configs' comments and the code's docstrings and comments.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .conftest import TEMPLATE
from .test_render import public_api

LIBRARY_SRC = TEMPLATE / "classifier-engine" / "src" / "classifier_engine"
TEXT_SUFFIXES = {".md", ".py", ".yaml", ".yml", ".sh", ".sbatch", ".toml", ".txt", ".cfg", ".ini", ""}
# The commands at a render's root, of every kind: a page may name only those its render has.
COMMANDS = ("main", "export", "pack", "sweep", "cross_validate", "check_labels")
# The library's modules a user runs or imports by path: public like the names of its API.
PUBLIC_MODULES = {"testing", "bench", "docs", "torchrun"}
# Project paths: the folders at a render's root (a path with a placeholder, <run> or *, is a pattern, not a file).
PROJECT_PATH = re.compile(r"(?<![\w./~-])((?:configs|docs|scripts|src|tests|benchmarks)/[\w./-]*\w)(?![\w<{*])")
PACKAGE_PATH = re.compile(r"(?<![\w./-])((?:models|data|callbacks)/\w+\.py)\b")
LIBRARY_PATH = re.compile(r"\bclassifier_engine/([\w/]+\.py)\b")
COMMAND = re.compile(rf"(?<![\w./-])((?:{'|'.join(COMMANDS)})\.py)\b")
LIBRARY_NAME = re.compile(r"\bclassifier_engine((?:\.\w+)+)")
# What only the other kind has, in the words a page would use for it: a render of each kind never says them.
OTHER_KIND = {
    "images": [r"\bthe fast recipe\b", r"\bcifar10_fast\b", r"\bon CIFAR\b", r"\bCifarDataModule\b"],
    "cifar": [r"\byour (?:own )?photos\b", r"\bpack\.py\b", r"\bPhotoDataModule\b", r"\bimages\.yaml\b"],
}
WRITTEN_BY_THE_PAGE = re.compile(r"^# ([\w./-]+):", flags=re.MULTILINE)  # "# configs/my_data.yaml: ..." above a file
ELSEWHERE = "of the template repository"  # a line naming a path of the repository the render came from


def render_texts(project: Path) -> dict[str, str]:
    """Every text file of a render a user reads, by its path in the render."""
    texts = {}
    for path in sorted(project.rglob("*")):
        relative = path.relative_to(project)
        if not path.is_file() or relative.parts[0] in {".git", ".venv"} or "images" in relative.parts[:2]:
            continue
        if path.suffix in TEXT_SUFFIXES or path.name == "Dockerfile":
            try:
                texts[str(relative)] = path.read_text()
            except UnicodeDecodeError:  # not text: a file a run left (a render's tests run in it)
                continue
    return texts


def untrue_names(project: Path, kind: str) -> list[str]:
    """``file: name`` for each name a render's text gives that is not in the render or the library's public API."""
    package = next((project / "src").iterdir())
    api = public_api()
    found = []
    for file, text in render_texts(project).items():
        written = set(WRITTEN_BY_THE_PAGE.findall(text))
        text = "\n".join(line for line in text.splitlines() if ELSEWHERE not in line)
        for path in PROJECT_PATH.findall(text):
            if not (project / path).exists() and path not in written:
                found.append(f"{file}: {path}")
        for path in PACKAGE_PATH.findall(text):
            library = f"classifier_engine/{path}" in text and not (package / path).exists()
            if not (package / path).exists() and not (library and (LIBRARY_SRC / path).exists()):
                found.append(f"{file}: {path}")
        for path in LIBRARY_PATH.findall(text):
            if not (LIBRARY_SRC / path).exists():
                found.append(f"{file}: classifier_engine/{path}")
        for command in COMMAND.findall(text):
            if not (project / command).is_file():
                found.append(f"{file}: {command}")
        for dotted in LIBRARY_NAME.findall(text):
            first, *rest = dotted.strip(".").split(".")
            configs_name = first == "callbacks" and (not rest or rest[0] in api)  # the configs' class_paths
            public = first in api or first in PUBLIC_MODULES or configs_name or first.startswith("__")
            if not public:
                found.append(f"{file}: classifier_engine{dotted}")
        for pattern in OTHER_KIND[kind]:
            found += [f"{file}: {match}" for match in re.findall(pattern, text)]
    return sorted(set(found))


@pytest.mark.parametrize("dataset", ["cifar10", "cifar100", "images"])
def test_every_name_a_render_gives_is_in_that_render_or_the_library_s_api(bake, dataset):
    project = bake(dataset=dataset)
    assert untrue_names(project, "images" if dataset == "images" else "cifar") == []


def test_the_check_catches_each_untrue_name_a_render_once_gave(bake):
    """The examples of renders that said what was not so: each one, put back, is caught."""
    cifar, photos = bake(dataset="cifar100"), bake(dataset="images", project_slug="photos")
    examples = {
        (cifar, ".github/workflows/ci.yml"): "docker run project:ci fit --config configs/images.yaml",
        (cifar, "README.md"): "main.py, export.py, ...  the commands; also sweep.py, pack.py, check_labels.py",
        (cifar, "configs/cifar10_fast.yaml"): "# validate only the final weights (benchmarks/bench_recipe.py)",
        (cifar, "scripts/torchrun.sh"): "exec python -m classifier_engine.machinery.torchrun main.py fit",
        (photos, "src/photos/__init__.py"): '"""An image classifier trained with PyTorch Lightning on CIFAR."""',
        (photos, "docs/data_and_speed.md"): "the fast path both datasets share; `data/cifar.py` packs",
        (photos, "README.md"): "| the data path, speed switches, the fast recipe | data_and_speed.md |",
        (photos, "docs/shipping.md"): "from classifier_engine.data.image_files import decode_image",
    }
    for (project, file), line in examples.items():
        path = project / file
        original = path.read_text()
        path.write_text(f"{original}\n{line}\n")
        kind = "images" if project == photos else "cifar"
        assert any(found.startswith(f"{file}: ") for found in untrue_names(project, kind)), (file, line)
        path.write_text(original)
    assert untrue_names(cifar, "cifar") == [] and untrue_names(photos, "images") == []
