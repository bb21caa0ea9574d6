"""``python serve.py --model <export folder>``: the exported model behind HTTP, answering as ``predict`` does.

``POST /predict`` takes one photo (raw bytes, a multipart upload as ``image``, or JSON ``{"image": base64}``)
and returns ``predict``'s answer as JSON: the label (the labels, with several), its calibrated probability,
"unknown" and why, the score against the training images, and the top classes. ``GET /health`` is ``ok`` once
every worker has opened the graph; ``GET /metrics`` counts the answers and times them (Prometheus); ``GET /`` is
a page to try it. Requests arriving together are run as one batch. ``--model`` is an export folder or a version
in MLflow's registry (``models:/NAME@ALIAS``). It imports no torch: the export's card and graph are the model.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..foundation.errors import OneLineArgumentParser, UsageError, exit_with
from ..foundation.noise import silence_known_noise
from .exported_model import FILES, ExportedModel, ServingError

DESCRIPTION = "Serve an exported model over HTTP: POST /predict answers as predict does, requests batched."


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineArgumentParser(prog="serve.py", description=DESCRIPTION)
    add = parser.add_argument
    add(
        "--model",
        required=True,
        help="the folder export.py wrote (checkpoints/export/ of a run), or a registered version: models:/NAME/1, "
        "models:/NAME@ALIAS (MLflow's registry: MLFLOW_TRACKING_URI, else export.py's sqlite:///runs/mlflow.db)",
    )
    add(
        "--format",
        choices=tuple(FILES),
        default="onnx",
        help="which of its graphs: onnx (float32) or int8. Not model.pt2: loading one runs what the file says "
        "(torch.export.load unpickles and calls the functions its graph names); onnxruntime reads a graph as data",
    )
    add("--host", default="127.0.0.1", help="the interface to listen on (0.0.0.0: every one, as in a container)")
    add("--port", type=int, default=8000, help="the port to listen on")
    add("--max_batch_size", type=int, default=8, help="most requests run as one batch")
    add("--batch_timeout", type=float, default=0.01, help="seconds a batch waits to fill before it runs")
    add("--workers", type=int, default=1, help="inference processes, each with the graph open")
    add("--threads", type=int, help="onnxruntime's threads per worker (default: onnxruntime's choice)")
    add("--top_k", type=int, default=5, help="how many of the most probable classes an answer lists")
    add("--max_request_mb", type=float, default=20, help="the largest request taken, in MB (larger: 413)")
    add("--max_waiting", type=int, default=64, help="requests one server process holds at once (more: 503, busy)")
    options = parser.parse_args(argv)
    counts = (options.max_batch_size, options.workers, options.top_k, options.max_waiting)
    if min(counts) < 1 or options.batch_timeout < 0:
        parser.error(
            "--max_batch_size, --workers, --top_k and --max_waiting must be at least 1, --batch_timeout 0 or more"
        )
    return options


# Where export.py --register writes unless told (configs/presets/mlflow.yaml).
REGISTRY_STORE = "sqlite:///runs/mlflow.db"


@contextmanager
def model_folder(given: str) -> Iterator[Path]:
    """The folder to serve: ``--model`` itself, or a registered version downloaded from MLflow's registry into a
    temporary folder that is removed when the server stops."""
    if not given.startswith("models:/"):
        yield Path(given)
        return
    try:
        import mlflow
    except ImportError:
        raise ServingError("serving a registered version needs mlflow; pip install -e '.[mlflow]'") from None
    if not os.environ.get("MLFLOW_TRACKING_URI"):
        mlflow.set_tracking_uri(REGISTRY_STORE)
    with tempfile.TemporaryDirectory(prefix="serve-registered-") as scratch:
        try:
            folder = mlflow.artifacts.download_artifacts(artifact_uri=given, dst_path=scratch)
        except Exception as error:  # MLflow's errors name no common base: which store, and the name asked for
            raise ServingError(
                f"{given} is not a version the registry at {mlflow.get_tracking_uri()} holds "
                f"({type(error).__name__}); give models:/NAME/VERSION or models:/NAME@ALIAS of a registered model, "
                "and MLFLOW_TRACKING_URI of its store"
            ) from None
        yield Path(folder)


def check_port(host: str, port: int) -> None:
    """A port something else listens on is one line before the workers start (uvicorn would say it its own way)."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as error:
        said = f"cannot listen on {host}:{port} ({error.strerror})"
        raise ServingError(f"{said}; stop what listens there or give another --port") from None


def card_name(value: object) -> str | None:
    """A name the card gives (a class's), printed only when it is one: the card is data."""
    return value if isinstance(value, str) and value.isidentifier() else None


def json_errors(app: object) -> None:
    """Errors as one JSON line, ``{"error": ...}``, like the gate's (FastAPI's own key is ``detail``)."""
    from fastapi import HTTPException
    from fastapi.responses import JSONResponse

    async def one_line(request: object, error: HTTPException) -> JSONResponse:
        detail = str(error.detail)
        return JSONResponse(
            {"error": detail if detail.startswith("error: ") else f"error: {detail}"}, error.status_code
        )

    app.add_exception_handler(HTTPException, one_line)


def stop_as_on_ctrl_c(signum: int, frame: object) -> None:
    """SIGTERM (``docker stop``, a Kubernetes pod ending) shuts the server down as Ctrl-C does: LitServe stops its
    workers, and a registered version's download is removed (by default SIGTERM ends the process where it is)."""
    raise KeyboardInterrupt


def serve(options: argparse.Namespace, folder: Path) -> None:
    """Open ``folder``'s graph (a bad folder: one line, before any worker starts) and serve it until stopped."""
    import litserve as ls

    from .api import ClassifierAPI
    from .gate import RequestGate

    opened = ExportedModel(folder, options.format, options.threads)
    check_port(options.host, options.port)
    api = ClassifierAPI(
        folder,
        options.format,
        options.top_k,
        options.threads,
        max_batch_size=options.max_batch_size,
        batch_timeout=options.batch_timeout,
    )
    limits = {"max_bytes": int(options.max_request_mb * 1024 * 1024), "max_waiting": options.max_waiting}
    gate = (RequestGate, {"path": api.api_path, **limits})
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=options.workers, middlewares=[gate])
    json_errors(server.app)
    task = "labels" if opened.rules.multilabel else "label"
    inside = card_name(opened.card.get("test_time_augmentation"))  # the views the graph averages, as predict
    print(
        f"Serving {options.model} ({options.format}, {len(opened.rules.class_names)} classes, a {task} per "
        f"answer{f', {inside} views averaged' if inside else ''}) at http://{options.host}:{options.port}/ "
        f"(POST /predict): batches of up to {options.max_batch_size}, {options.workers} worker(s); GET /health "
        "says when it is ready",
        flush=True,
    )
    evaluation = opened.card.get("evaluation")
    views = card_name(evaluation.get("test_time_augmentation_of_the_run") if isinstance(evaluation, dict) else None)
    if views:
        print(
            f"note: the run's predict averages {views} views; the exported files, and so this server, "
            "compute one view of each image",
            flush=True,
        )
    # One API process (it only reads requests and waits): the gate's count of waiting requests and its figures
    # at /metrics are then the whole server's.
    signal.signal(signal.SIGTERM, stop_as_on_ctrl_c)
    server.run(host=options.host, port=options.port, num_api_servers=1, generate_client_file=False, log_level="warning")


def main(argv: list[str] | None = None) -> int:
    silence_known_noise()
    options = parse_args(argv)
    try:
        with model_folder(options.model) as folder:
            serve(options, folder)
    except ImportError as error:
        exit_with(UsageError(f"serving needs {error.name}, which is not installed; pip install -e '.[serve]'"))
    except Exception as error:  # a user's mistake: one line (FULL_ERROR=1: the traceback)
        exit_with(error)
    return 0


def run_serve() -> None:
    """``python serve.py --model <export folder>``: the project's entry script. It takes no model class (as the
    other commands do) because serving imports no torch: an image that serves holds onnxruntime alone."""
    sys.exit(main())


if __name__ == "__main__":
    run_serve()
