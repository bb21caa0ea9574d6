"""The exported ONNX files as new versions in MLflow's model registry, which a deployment pulls by alias.

fp32 and int8 are distinct registered models, ``NAME`` and ``NAME-int8``: the versions of one model
are successive releases a deployment can swap between (an alias such as ``candidate`` moves from
one to the next), and it chooses its precision once, by name. Each version carries the signature
(uint8 NCHW images in, float32 logits out), a few of the judged images as its input example, the
model card and the run's ``config.yaml`` as files, and the card's accuracies as metrics. Each
export is an MLflow run of its own (``<run>-export-step<N>``), nested in the training run's MLflow
run when the run was tracked in the same store, so that the registry leads from a version to the
training that made it (and a model takes only its own export's metrics: MLflow gives a newly
logged model the metrics its run already holds at its step).

Registering is the export's last step: the files are written and checked first, so a registry that
cannot be reached loses nothing; the store is tried before any work starts, so a wrong URI costs
seconds, not an export.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ..foundation.errors import UserError
from .contract import INPUT_NAME, OUTPUT_NAME
from .errors import ExportError
from .model_card import CARD_JSON, CARD_MARKDOWN, int8_loss

DEFAULT_TRACKING_URI = "sqlite:///runs/mlflow.db"  # configs/presets/mlflow.yaml's store
REGISTERED_SUFFIX = {"onnx": "", "int8": "-int8"}
RESERVED_ALIAS = re.compile(r"^(latest|v\d+)$", re.IGNORECASE)  # MLflow's own: the newest version, version N


class RegistryError(UserError):
    """The registry could not be reached or refused a version; the exported files are kept."""


@dataclass(frozen=True)
class Registered:
    """One registered version: ``models:/NAME/VERSION`` (and ``models:/NAME@ALIAS``)."""

    name: str
    version: str
    alias: str | None
    run_id: str

    def uri(self) -> str:
        return f"models:/{self.name}@{self.alias}" if self.alias else f"models:/{self.name}/{self.version}"


def check_request(name: str, alias: str | None) -> None:
    """A name or alias MLflow would refuse, refused before the export starts."""
    if not name.strip() or "/" in name or ":" in name:
        raise ExportError(f"--register {name!r}: a registered model's name is not empty and has no '/' or ':'")
    if alias is not None and (not re.fullmatch(r"[\w-]+", alias) or RESERVED_ALIAS.match(alias)):
        raise ExportError(
            f"--alias {alias!r}: use letters, digits, '_' and '-' (MLflow keeps 'latest' and 'v<N>' for itself), "
            "e.g. --alias candidate"
        )


def import_mlflow() -> Any:
    try:
        import mlflow
    except ImportError:
        raise ExportError("--register needs mlflow, which is not installed; pip install -e '.[mlflow]'") from None
    return mlflow


def run_directory(ckpt_path: Path) -> Path:
    """``runs/<dataset>/<hash>/`` for ``runs/<dataset>/<hash>/checkpoints/<file>.ckpt``."""
    return ckpt_path.resolve().parent.parent


def tracked_run(ckpt_path: Path, configs: tuple[Path, ...] = ()) -> tuple[str | None, str | None, str]:
    """(tracking URI, experiment, run name) of the MLflow logger the command's ``configs`` name (``--config``, the
    last one that names one); URI and experiment None when untracked.

    Only a config the user passes is read: a config.yaml that merely sits beside a checkpoint is not.
    """
    directory = run_directory(ckpt_path)
    for config_path in reversed(configs):
        config = yaml.safe_load(Path(config_path).read_text()) or {}
        logger = (config.get("trainer") or {}).get("logger") if isinstance(config, dict) else None
        for item in logger if isinstance(logger, list) else [logger]:
            if isinstance(item, dict) and str(item.get("class_path", "")).endswith("MLFlowLogger"):
                args = item.get("init_args") or {}
                uri = args.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI")
                return uri, args.get("experiment_name") or "lightning_logs", args.get("run_name") or directory.name
    return None, None, directory.name


def default_tracking_uri(ckpt_path: Path, configs: tuple[Path, ...] = ()) -> str:
    """The store the run was tracked in (as the command's ``--config`` says), else the project's SQLite file."""
    return tracked_run(ckpt_path, configs)[0] or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


@contextmanager
def patient_for(seconds: int) -> Iterator[None]:
    """MLflow's HTTP client retries a silent server with backoff for minutes; a first probe should not."""
    wanted = {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": str(seconds),
    }
    saved = {key: os.environ.get(key) for key in wanted}
    os.environ.update({key: value for key, value in wanted.items() if saved[key] is None})  # the user's own win
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)


def check_registry(tracking_uri: str) -> None:
    """Reach the store (a SQLite file is created) before the export spends minutes: one line if it cannot be."""
    mlflow = import_mlflow()
    try:
        with patient_for(seconds=10):
            mlflow.MlflowClient(tracking_uri).search_registered_models(max_results=1)
    except Exception as error:
        raise ExportError(
            f"cannot reach the model registry at {tracking_uri} ({first_line(error)}); start the server or pass "
            f"--tracking_uri (e.g. {DEFAULT_TRACKING_URI}); nothing was exported"
        ) from error


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def training_run_id(mlflow: Any, tracking_uri: str, ckpt_path: Path, configs: tuple[Path, ...]) -> str | None:
    """The MLflow run that trained the checkpoint, if it was tracked in this store (as ``configs`` say)."""
    uri, experiment_name, run_name = tracked_run(ckpt_path, configs)
    if uri is None or uri != tracking_uri:
        return None
    experiment = mlflow.get_experiment_by_name(experiment_name)
    if experiment is None:
        return None
    runs = mlflow.search_runs(
        [experiment.experiment_id],
        filter_string=f"attributes.run_name = '{run_name}'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
        output_format="list",
    )
    return runs[0].info.run_id if runs else None


def signature(card: dict) -> Any:
    from mlflow.models import ModelSignature
    from mlflow.types import Schema, TensorSpec

    size, classes = card["input"]["shape"][2], card["output"]["shape"][1]
    return ModelSignature(
        inputs=Schema([TensorSpec(np.dtype(np.uint8), (-1, 3, size, size), INPUT_NAME)]),
        outputs=Schema([TensorSpec(np.dtype(np.float32), (-1, classes), OUTPUT_NAME)]),
    )


def metrics(card: dict, format_name: str) -> dict[str, float]:
    """The card's accuracies of this file and of PyTorch on the same images (fractions), named by what they measure.

    The names carry the format: both files log into the same MLflow run, where a bare ``top1`` would hold two values.
    """
    accuracy, eager = card["artifacts"][format_name].get("accuracy") or {}, card["eager"] or {}
    keys = ("mAP", "f1_micro", "f1_macro") if card.get("task") == "multilabel" else ("top1", "top5")
    found = {f"export/{format_name}/{key}": accuracy.get(key) for key in keys}
    found.update({f"export/pytorch/{key}": eager.get(key) for key in keys})
    if format_name == "int8" and card["int8"]:
        measure, drop, _ = int8_loss(card["int8"])
        found[f"export/int8/{'top1' if measure == 'top-1' else measure}_drop_points"] = drop
    return {key: float(value) for key, value in found.items() if value is not None}


def summary(card: dict, format_name: str) -> str:
    """A version's description in the registry: what file, from which checkpoint, how good."""
    artifact, source, evaluation = card["artifacts"][format_name], card["source"], card["evaluation"]
    accuracy = artifact.get("accuracy")
    if accuracy and card.get("task") == "multilabel":
        figures = (
            f"mAP {100 * accuracy['mAP']:.2f} %, micro-F1 {100 * accuracy['f1_micro']:.2f} % at the card's thresholds"
        )
    elif accuracy:
        figures = f"top-1 {100 * accuracy['top1']:.2f} %, top-5 {100 * accuracy['top5']:.2f} %"
    judged = (
        f"{figures} on {accuracy['images']} images of the {evaluation['dataset']} {evaluation['split']} split"
        if accuracy
        else f"accuracy not measured ({evaluation.get('skipped')})"
    )
    return (
        f"{artifact['file']} ({artifact['format']}) from {source['checkpoint']}, step {source['global_step']}, "
        f"config hash {str(source['config_hash'])[:12]}: {judged}. The model card is among the version's files."
    )


def quiet_mlflow() -> None:
    """MLflow's progress bars and info lines while it copies files about; its warnings and errors stay."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    logging.getLogger("mlflow").setLevel(logging.WARNING)


def register(
    name: str,
    alias: str | None,
    tracking_uri: str,
    ckpt_path: Path,
    folder: Path,
    card: dict,
    examples: np.ndarray,
    experiment: str,
    configs: tuple[Path, ...] = (),
) -> list[Registered]:
    """Log and register every ONNX file of the export in ``folder``; returns the new versions.

    ``experiment``: where the export's run goes when no training run of the checkpoint is tracked (the project's);
    ``configs``: the export's ``--config`` files, logged beside the model and read for the training run's store.
    """
    mlflow = import_mlflow()
    import onnx

    files = [folder / CARD_JSON, folder / CARD_MARKDOWN]
    files += [Path(config) for config in configs]
    registered = []
    step = int(card["source"]["global_step"] or 0)
    quiet_mlflow()
    try:
        mlflow.set_tracking_uri(tracking_uri)
        run_id = training_run_id(mlflow, tracking_uri, ckpt_path, configs)
        if run_id is None:
            mlflow.set_experiment(experiment)
        export_run = f"{run_directory(ckpt_path).name}-export-step{step}"
        with ExitStack() as runs:
            if run_id is not None:  # each export a run of its own, nested in the training run
                runs.enter_context(mlflow.start_run(run_id=run_id))
            runs.enter_context(mlflow.start_run(run_name=export_run, nested=run_id is not None))
            run_id = mlflow.active_run().info.run_id
            mlflow.set_tags({"config_hash": card["source"]["config_hash"], "checkpoint": card["source"]["checkpoint"]})
            client = mlflow.MlflowClient()
            logged = {}
            for format_name, artifact in card["artifacts"].items():
                if format_name not in REGISTERED_SUFFIX:
                    continue  # torch.export's .pt2 has no MLflow flavour: it stays beside the card
                model_name = name + REGISTERED_SUFFIX[format_name]
                logged[format_name] = mlflow.onnx.log_model(
                    onnx.load(str(folder / artifact["file"])),
                    name=format_name,
                    registered_model_name=model_name,
                    signature=signature(card),
                    input_example={INPUT_NAME: examples},
                    onnx_execution_providers=["CPUExecutionProvider"],
                    extra_files=[str(path) for path in files],
                    metadata={"model_card": CARD_JSON, "config_hash": card["source"]["config_hash"]},
                    step=step,
                )
                version = str(logged[format_name].registered_model_version)
                registered.append(Registered(model_name, version, None, run_id))
            # Only after every file is logged: a model logged later would take these as the run's metrics too.
            for (format_name, info), version in zip(logged.items(), registered, strict=True):
                mlflow.log_metrics(metrics(card, format_name), step=step, model_id=info.model_id)
                client.update_model_version(version.name, version.version, description=summary(card, format_name))
                if alias:
                    client.set_registered_model_alias(version.name, alias, version.version)
            registered = [replace(version, alias=alias) for version in registered]
    except Exception as error:
        done = "".join(f"; {item.uri()} was registered" for item in registered)
        raise RegistryError(
            f"registering in {tracking_uri} failed ({first_line(error)}){done}; the exported files are in {folder}: "
            "export again with --register once the registry answers"
        ) from error
    return registered
