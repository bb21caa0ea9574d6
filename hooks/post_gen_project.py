"""Keep only what the answers need, point the locks at the library this template was rendered with, say what next.

A photo render keeps no CIFAR file and a CIFAR render no photo-folder file: each keeps its own recipe's
callbacks (the fine-tune's, the fast recipe's) and tests; the networks of one kind are chosen in the template
itself. The project pins ``classifier-engine`` at this checkout's version; the two lock files also say where it
comes from: this same checkout (offline) when the template was a local folder, else the same git commit of its
repository.
Messages go to stderr, so that tools which render the template to compare trees (``cruft diff``) print
only the difference on stdout.
"""

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ANSWERS = json.loads(r"""{{ cookiecutter | tojson }}""")
LIBRARY = "classifier-engine"
ABBREVIATIONS = {"gh": "https://github.com/{}.git", "gl": "https://gitlab.com/{}.git", "bb": "https://bitbucket.org/{}"}
ONLY_FOR = {  # files of one kind of render: removed from the other
    "images": ["src/{import_name}/data/photos.py", "configs/images.yaml", "configs/presets/from_scratch.yaml",
               "configs/presets/streaming.yaml", "pack.py", "docs/own_data.md",
               "src/{import_name}/callbacks/freeze_backbone.py", "src/{import_name}/callbacks/weight_averaging.py"],
    "cifar": ["src/{import_name}/data/cifar.py", "configs/cifar10.yaml", "configs/cifar10_fast.yaml",
              "src/{import_name}/callbacks/lookahead.py", "src/{import_name}/callbacks/whitening.py",
              "tests/test_airbench.py"],
}  # fmt: skip


def prune(project: Path) -> None:
    kept = "images" if ANSWERS["dataset"] == "images" else "cifar"
    for kind, paths in ONLY_FOR.items():
        if kind != kept:
            for path in paths:
                (project / path.format(import_name=ANSWERS["import_name"])).unlink(missing_ok=True)


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def template_folder(template: str) -> Path | None:
    """The template's folder when rendered from one; a relative path is the caller's ($PWD: hooks run elsewhere)."""
    if "://" in template or template.startswith("git@") or template.partition(":")[0] in ABBREVIATIONS:
        return None
    caller = Path(os.environ.get("PWD", os.getcwd()))
    for candidate in (caller / Path(template).expanduser(), Path(ANSWERS.get("_repo_dir", "")).expanduser()):
        if candidate.is_absolute() and (candidate / LIBRARY / "pyproject.toml").is_file():
            return candidate.resolve()
    return None


def library_source() -> str:
    """Where pip finds the library: this checkout's folder (a local template), else its repository at this commit."""
    template, repo_dir = ANSWERS.get("_template", ""), Path(ANSWERS.get("_repo_dir", "."))
    folder = template_folder(template)
    if folder is not None:
        return (folder / LIBRARY).as_uri()
    prefix, _, rest = template.partition(":")
    url = ABBREVIATIONS[prefix].format(rest) if prefix in ABBREVIATIONS and "//" not in rest else template
    commit = ANSWERS.get("_checkout") or ""
    with contextlib.suppress(OSError, subprocess.CalledProcessError):  # no clone at hand: the checkout asked for
        commit = git("rev-parse", "HEAD", cwd=repo_dir)
    url = url if url.startswith("git+") else f"git+{url}"
    return f"{url}@{commit}#subdirectory={LIBRARY}" if commit else f"{url}#subdirectory={LIBRARY}"


def point_locks_at(source: str, project: Path) -> None:
    for lock in ("constraints.txt", "constraints-cpu.txt"):
        path = project / lock
        text = path.read_text()
        text = re.sub(rf"^({LIBRARY}==\S+)$", rf"\1\n{LIBRARY} @ {source}", text, count=1, flags=re.M)
        path.write_text(text)


project = Path.cwd()
prune(project)
point_locks_at(library_source(), project)
print(
    f"""
Rendered {ANSWERS["project_slug"]}/. Next:

    cd {ANSWERS["project_slug"]}
    python -m venv .venv && . .venv/bin/activate
    python -m pip install --upgrade "pip>=25"
    pip install -c constraints.txt -e ".[dev]"    # for the CPU-only lock, see README.md (Install)
    python main.py fit --config configs/{ANSWERS["dataset"]}.yaml
""",
    file=sys.stderr,
)
