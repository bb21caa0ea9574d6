"""A checkpoint is data, by construction: a gadget hidden anywhere a command reads never runs, fetches or builds.

Starting from a real checkpoint of each render (a one-epoch run), hypothesis injects a gadget of the corpus
at a key path of a section Lightning or the library reads (the model's and the data's settings, the
preprocessing and calibration records, the callbacks' and the loops' states, the top level, Lightning's older
hyperparameter keys), writes the file, and runs a command on it in this process: ``predict``, ``test``,
``validate``, a resumed ``fit`` (the run's own config) and ``export.py`` (the project's default config).

The corpus, by kind:

- **string**: a YAML class spec as a string, in a plain value, in an untyped argument of a trusted loss, in a
  typed argument of a trusted layer;
- **path** and **URL**: a YAML file that names a command, as a path, a ``file://`` URL and an ``http://`` URL
  of a server this test runs on localhost (it counts the requests);
- **name**: dotted names with attribute traversal and look-alike letters;
- **imported**: classes a trusted module merely imports (``tempfile.TemporaryDirectory`` in timm, optuna's
  journal file in the library's sweeps), pointed at a folder that must stay empty;
- **older keys**: ``module_arguments`` and ``hparams``, which ``load_from_checkpoint`` would merge;
- **size**: zero-stride tensors of absurd shapes.

Each case asserts that the marker file never appears, that no request reached the server and nothing was
made in the watched folder, that a refusal is one ``error:`` line with a non-zero exit, and that nothing
changed in the run (a checkpoint never: a refused evaluation or export writes nothing at all). Seeded
(``derandomize``): a failure reproduces with the same examples.
"""

from __future__ import annotations

import contextlib
import http.server
import io
import shutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from classifier_engine.cli.trainer_cli import TrainerCLI
from classifier_engine.commands import export as export_command
from classifier_engine.foundation.errors import exit_with

from .conftest import (
    PHOTO_ROOT,
    PROJECT_ROOT,
    fit_args,
    images_args,
    only_run_dir,
    run_cli,
    tree,
    write_image_folder,
    write_tiny_archive,
)

COMMANDS = ("predict", "test", "validate", "fit", "export")
# Sections a command reads, walked for key paths (loops and optimizer states only a resumed fit reads).
SECTIONS = ("hyper_parameters", "datamodule_hyper_parameters", "preprocessing", "calibration", "callbacks", "loops")
OLDER_KEYS = ("module_arguments", "hparams")
EXAMPLES = 6  # drawn per render, after the aimed ones (each case a command in this process, 1 to 3 s: CI's 2 minutes)
# Where the explicit cases put each kind: the settings a parser would build a class from, the older keys, the bank.
AIMED = {
    "string": [("hyper_parameters", "loss"), ("hyper_parameters", "backbone"), ("hyper_parameters", "optimizer")],
    "path": [("hyper_parameters", "backbone"), ("hyper_parameters", "lr_schedule")],
    "url": [("hyper_parameters", "test_time_augmentation"), ("hyper_parameters", "backbone")],
    "name": [("hyper_parameters", "loss"), ("hyper_parameters", "lr_schedule")],
    "imported": [("hyper_parameters", "backbone"), ("hyper_parameters", "loss")],
    "older": [("module_arguments",), ("hparams",)],
    "size": [("domain_bank",), ("state_dict", "injected")],
}


@dataclass
class Trap:
    """What a gadget would touch if anything ran it: a marker file, a folder, a server on localhost."""

    root: Path
    requests: list[str] = field(default_factory=list)
    url: str = ""

    @property
    def marker(self) -> Path:
        return self.root / "MARKER"

    @property
    def folder(self) -> Path:
        return self.root / "watched"

    @property
    def yaml_file(self) -> Path:
        return self.root / "evil.yaml"

    def sprung(self) -> list[str]:
        found = [f"{self.marker} exists"] if self.marker.exists() else []
        found += [f"{path} made" for path in self.folder.iterdir()]
        return found + [f"the server was asked for {path}" for path in self.requests]


def popen(trap: Trap) -> dict[str, Any]:
    return {"class_path": "subprocess.Popen", "init_args": {"args": ["touch", str(trap.marker)]}}


def yaml_spec(trap: Trap) -> str:
    return f"{{class_path: subprocess.Popen, init_args: {{args: [touch, {trap.marker}]}}}}"


def spec(class_path: str, **arguments: Any) -> dict[str, Any]:
    return {"class_path": class_path, "init_args": arguments}


# (kind, gadget): each makes the value to inject from the trap.
GADGETS: list[tuple[str, Callable[[Trap], Any]]] = [
    ("string", yaml_spec),
    ("string", popen),
    ("string", lambda trap: spec("torch.nn.CrossEntropyLoss", size_average=yaml_spec(trap))),
    ("string", lambda trap: spec("torch.nn.Linear", in_features=4, out_features=10, device=yaml_spec(trap))),
    ("string", lambda trap: [yaml_spec(trap)]),
    ("path", lambda trap: str(trap.yaml_file)),
    ("url", lambda trap: trap.yaml_file.as_uri()),
    ("url", lambda trap: trap.url),
    ("url", lambda trap: spec("torch.optim.SGD", lr=trap.url)),
    ("name", lambda trap: "subprocess.Popen"),
    ("name", lambda trap: spec("torch.nn.functional.os.system", command=f"touch {trap.marker}")),
    ("name", lambda trap: spec("subprocess.P\u043epen", args=["touch", str(trap.marker)])),  # a Cyrillic o
    ("name", lambda trap: spec("torch.nn.L\u0456near", in_features=1, out_features=1)),  # a Cyrillic i
    ("imported", lambda trap: spec("timm.models._hub.TemporaryDirectory", dir=str(trap.folder))),
    ("imported", lambda trap: spec("classifier_engine.sweeps.study.JournalFileBackend",
                                   file_path=str(trap.folder / "journal.log"))),
    ("older", lambda trap: {"optimizer": popen(trap), "backbone": yaml_spec(trap)}),
    ("size", lambda trap: torch.zeros(1, dtype=torch.float16).expand(2**31, 16)),
    ("size", lambda trap: torch.zeros(1).expand(2**20, 2**20)),
]  # fmt: skip


def aimed_cases(every_command: bool) -> list[tuple[str, tuple, int]]:
    """Each kind of gadget where a parser would take it (``AIMED``): on every command, or each on one command in turn
    (the commands share the code that takes a checkpoint's settings; the first render covers every pair)."""
    cases = []
    for number, command in enumerate(COMMANDS):
        for turn, (kind, places) in enumerate(AIMED.items()):
            if not every_command and (turn % len(COMMANDS)) != number:
                continue
            gadgets = [index for index, (of_kind, _) in enumerate(GADGETS) if of_kind == kind]
            cases.append((command, places[number % len(places)], gadgets[number % len(gadgets)]))
    return cases


def key_paths(checkpoint: dict) -> list[tuple[str, ...]]:
    """Every key path under the read sections (each dict's keys, each list's items), the top level's keys, a new key
    in each section, and Lightning's older hyperparameter keys."""
    paths: list[tuple[str, ...]] = [(key,) for key in checkpoint if key != "state_dict"]
    paths += [(key,) for key in OLDER_KEYS]

    def walk(value: Any, path: tuple) -> None:
        if isinstance(value, dict):
            paths.append((*path, "injected"))
            for key, item in value.items():
                paths.append((*path, key))
                walk(item, (*path, key))
        elif isinstance(value, list | tuple) and len(value) <= 16:
            for index, item in enumerate(value):
                paths.append((*path, index))
                walk(item, (*path, index))

    for section in SECTIONS:
        walk(checkpoint.get(section), (section,))
    return sorted(set(paths), key=str)


def injected(checkpoint: dict, path: tuple, value: Any) -> dict:
    """A copy of ``checkpoint`` with ``value`` at ``path`` (a list item replaced, a dict key set)."""
    crafted = dict(checkpoint)
    parent, *rest = path
    if not rest:
        crafted[parent] = value
        return crafted
    node = crafted[parent] = _copied(crafted[parent])
    for key in rest[:-1]:
        node[key] = _copied(node[key])
        node = node[key]
    node[rest[-1]] = value
    return crafted


def _copied(node: Any) -> Any:
    return dict(node) if isinstance(node, dict) else list(node)


@contextlib.contextmanager
def server(trap: Trap) -> Iterator[None]:
    """An HTTP server on localhost that serves the YAML gadget and records every request it gets."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            trap.requests.append(self.path)
            body = trap.yaml_file.read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    trap.url = f"http://127.0.0.1:{httpd.server_address[1]}/evil.yaml"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        httpd.shutdown()
        httpd.server_close()


@dataclass(frozen=True)
class Render:
    """A render, its model and default config, and a folder with its one-epoch run."""

    name: str
    model_class: type
    default_config: Path
    root: Path
    config_args: tuple[str, ...]  # what evaluation commands add (the data's folder and sizes)

    @property
    def run_dir(self) -> Path:
        return only_run_dir(self.root)


def in_process(render: Render, command: str, checkpoint: Path, output: Path) -> tuple[int, str]:
    """The command on ``checkpoint`` in this process: its exit code and what it printed to stderr."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        try:
            if command == "export":
                argv = ["--ckpt_path", str(checkpoint), "--formats", "onnx", "--output_dir", str(output),
                        "--eval_limit", "0"]  # fmt: skip
                code = export_command.main(render.model_class, render.name, argv, render.default_config)
            else:
                if command == "fit":
                    args = ["fit", "--config", str(render.run_dir / "config.yaml"), f"--ckpt_path={checkpoint}"]
                else:
                    args = [command, *render.config_args, f"--ckpt_path={checkpoint}"]
                    args += [f"--trainer.default_root_dir={output}"]
                try:
                    TrainerCLI(render.model_class, default_config=render.default_config, args=args)
                except Exception as error:
                    exit_with(error)
                code = 0
        except SystemExit as exited:
            code = exited.code if isinstance(exited.code, int) else 1
    return code, stderr.getvalue()


def checkpoints(root: Path) -> dict[str, str]:
    return {name: digest for name, digest in tree(root / "runs").items() if name.endswith(".ckpt")}


@pytest.fixture(scope="module")
def renders(tmp_path_factory) -> dict[str, Render]:
    """The CIFAR render's and the photo render's one-epoch runs."""
    from cifar_classifier.models import ImageClassifier as CifarModel
    from photo_classifier.models import ImageClassifier as PhotoModel

    cifar_root = tmp_path_factory.mktemp("cifar")
    write_tiny_archive(cifar_root / "data")
    run_cli(*fit_args("data"), cwd=cifar_root)
    photo_root = tmp_path_factory.mktemp("photos")
    photos = write_image_folder(photo_root / "photos", per_class=8)
    run_cli(*images_args(photos, "--trainer.max_epochs=1"), cwd=photo_root)
    cifar_args = ("--data.data_dir=data", "--data.verify_checksum=false", "--data.val_size=32", "--data.num_workers=0")
    photo_args = (f"--data.image_dir={photos}", "--data.num_workers=0")
    common = ("--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false", "--trainer.logger=false")
    return {
        "cifar": Render("cifar-classifier", CifarModel, PROJECT_ROOT / "configs" / "cifar10.yaml", cifar_root,
                        (*cifar_args, *common)),
        "photos": Render("photo-classifier", PhotoModel, PHOTO_ROOT / "configs" / "images.yaml", photo_root,
                         (*photo_args, *common)),
    }  # fmt: skip


@pytest.mark.parametrize(
    "which",
    [pytest.param("cifar", marks=pytest.mark.slow), "photos"],  # the same gadgets; CI runs the photo render's
)
def test_no_gadget_in_a_checkpoint_runs_on_any_command(renders, which, tmp_path_factory, monkeypatch):
    render = renders[which]
    monkeypatch.chdir(render.root)  # the runs' relative folders (data/, runs/) resolve as a user's would
    original = torch.load(render.run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    paths = key_paths(original)
    outcomes: dict[str, int] = {"refused": 0, "ran": 0}

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(
        command=st.sampled_from(COMMANDS),
        path=st.sampled_from(paths),
        gadget=st.sampled_from(range(len(GADGETS))),
    )
    def case(command: str, path: tuple, gadget: int) -> None:
        work = tmp_path_factory.mktemp("case")
        trap = Trap(work)
        trap.folder.mkdir()
        with server(trap):
            trap.yaml_file.write_text(yaml_spec(trap) + "\n")
            crafted = work / "shared.ckpt"
            torch.save(injected(original, path, GADGETS[gadget][1](trap)), crafted)
            before = tree(render.root / "runs")
            code, stderr = in_process(render, command, crafted, work / "out")
        kind = GADGETS[gadget][0]
        assert not trap.sprung(), f"{command}, {kind} gadget at {path}: {trap.sprung()}"
        if code == 0:
            outcomes["ran"] += 1
        else:
            outcomes["refused"] += 1
            lines = [line for line in stderr.splitlines() if line.strip()]
            assert len(lines) == 1 and lines[0].startswith("error: "), f"{command}, {kind} at {path}: {stderr[-2000:]}"
            assert "Traceback" not in stderr
            if command != "fit":  # a failed resume may leave its logs; no checkpoint changes (below)
                assert tree(render.root / "runs") == before, f"{command}, {kind} at {path} wrote into the run"
                assert not (work / "out").exists() or not any((work / "out").rglob("*.ckpt"))
        assert checkpoints(render.root) == {k: v for k, v in before.items() if k.endswith(".ckpt")}
        shutil.rmtree(work, ignore_errors=True)

    aimed = aimed_cases(every_command=which == "cifar")
    for command, path, gadget in aimed:
        case = example(command=command, path=path, gadget=gadget)(case)
    case()
    # Every aimed gadget is refused, but the older keys': nothing reads them, so the command runs as if they were not.
    assert outcomes["refused"] >= sum(GADGETS[gadget][0] != "older" for *_, gadget in aimed), outcomes
