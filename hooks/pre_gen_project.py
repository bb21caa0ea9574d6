"""Refuse answers that would render a broken project, before any file is written.

The answers are embedded as JSON inside a raw string and parsed with ``json.loads``: a
value such as ``x"); import os; os.system("...")`` stays data and is never executed.
Any non-zero exit makes cookiecutter delete the project folder it just created.
"""

import json
import keyword
import re
import sys

ANSWERS = json.loads(r"""{{ cookiecutter | tojson }}""")

# Packages the rendered project imports: a package named like one of them would shadow it.
SHADOWED_PACKAGES = {
    "classifier_engine",
    "torch",
    "torchvision",
    "torchmetrics",
    "lightning",
    "pytorch_lightning",
    "lightning_fabric",
    "jsonargparse",
    "numpy",
    "tensorboard",
    "onnx",
    "onnxruntime",
    "onnxscript",
    "thop",
    "yaml",
    "pytest",
    "main",
    "tests",
}

SLUG_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
IMPORT_NAME_PATTERN = re.compile(r"[a-z_][a-z0-9_]{0,39}")


def import_name_problem(name: str) -> str | None:
    """Say why ``name`` cannot be the rendered package's import name, or return None."""
    if not IMPORT_NAME_PATTERN.fullmatch(name):
        return (
            f"import_name {name!r} is not a valid lowercase Python identifier of at most 40 characters "
            "(letters a-z, digits and underscores, not starting with a digit); "
            "pass e.g. import_name=my_project"
        )
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        return f"import_name {name!r} is a Python keyword; pick another name, e.g. import_name={name}_project"
    if name in SHADOWED_PACKAGES or name in sys.stdlib_module_names:
        return (
            f"import_name {name!r} would shadow the package {name!r} that the project depends on "
            f"(or the standard library); pick another name, e.g. import_name={name}_project"
        )
    return None


def slug_problem(slug: str) -> str | None:
    """Say why ``slug`` cannot be the project's folder name, or return None."""
    if not SLUG_PATTERN.fullmatch(slug) or len(slug) > 100:
        return (
            f"project_slug {slug!r} is not a usable folder name: use letters, digits, '.', '_' "
            "or '-', start with a letter or digit, at most 100 characters; pass e.g. project_slug=my-project"
        )
    return None


def main() -> int:
    slug, import_name = ANSWERS["project_slug"], ANSWERS["import_name"]
    problem = slug_problem(slug)
    if problem is None or import_name != slug.replace("-", "_"):
        # An import name derived from a refused slug would only repeat the slug's problem.
        problem = problem or import_name_problem(import_name)
    if problem:
        print(f"ERROR: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
