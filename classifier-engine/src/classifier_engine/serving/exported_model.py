"""An exported folder as a server holds it: the card's record, an onnxruntime session, the answers ``predict`` gives.

The folder is data from elsewhere (a release, a registry download): the card is read as plain values against a
schema (the preprocessing record's own check, the class names as strings, each threshold a finite number), and
the graph is one of the folder's own ``.onnx`` files, opened by onnxruntime, which runs no code of the file.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..data.image_files import BadImageError, decode_image
from ..data.preprocessing import Preprocessing
from ..foundation.errors import UsageError
from ..models.answers import Answer, answers

CARD = "model.card.json"
FILES = {"onnx": "model.onnx", "int8": "model.int8.onnx"}
# A version downloaded from MLflow's registry (export.py --register): the graph at the root as model.onnx (fp32 as
# NAME, int8 as NAME-int8), the card among its extra files.
REGISTERED, REGISTERED_CARDS = "MLmodel", "extra_files"
MAX_CARD_BYTES = 16 * 1024 * 1024  # a card holds names and figures: far more than any real one


class ServingError(UsageError):
    """What keeps a folder from being served, in one line."""


@dataclass(frozen=True)
class Rules:
    """How the card says to read the graph's outputs: the task, the classes and the thresholds of "unknown"."""

    multilabel: bool
    class_names: tuple[str, ...]
    unlike_training: float | None  # "unknown" where the output ``score`` is below it
    likely_mistake: float | None  # one label: "unknown" where the top probability is below it
    thresholds: np.ndarray | None  # several labels: each class is given at or above its own


def number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ServingError(f"the card's {what} is not a number; export the model again with export.py")
    return float(value)


def read_card(folder: Path) -> dict:
    path = folder / CARD
    if not path.is_file():
        raise ServingError(f"{folder} has no {CARD}; give the folder export.py wrote (checkpoints/export/)")
    if path.stat().st_size > MAX_CARD_BYTES:
        raise ServingError(f"{path} is larger than any model card; give the folder export.py wrote")
    try:
        card = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ServingError(f"{path} is not a model card ({error}); give the folder export.py wrote") from None
    if not isinstance(card, dict):
        raise ServingError(f"{path} is not a model card; give the folder export.py wrote")
    return card


def rules_of(card: dict) -> Rules:
    """The card's task, classes and thresholds, each checked as a plain value of its kind."""
    calibration = card.get("calibration") or {}
    names = card.get("class_names")
    if not isinstance(names, list) or not names or not all(isinstance(name, str) for name in names):
        raise ServingError("the card's class_names are not a list of names; export the model again with export.py")
    if not isinstance(calibration, dict) or calibration.get("task") not in ("multiclass", "multilabel", None):
        raise ServingError("the card's calibration is not one export.py writes; export the model again")
    multilabel = card.get("task") == "multilabel"
    unknown = calibration.get("unknown") or {}
    if not isinstance(unknown, dict):
        raise ServingError("the card's unknown rules are not a set of values; export the model again with export.py")
    unlike, mistake = unknown.get("unlike_training") or {}, unknown.get("likely_mistake") or {}
    if not isinstance(unlike, dict) or not isinstance(mistake, dict):
        raise ServingError("the card's unknown rules are not a set of values; export the model again with export.py")
    thresholds = None
    if multilabel:
        given = calibration.get("thresholds")
        if not isinstance(given, list) or len(given) != len(names):
            raise ServingError("the card gives no threshold per class; export the model again with export.py")
        thresholds = np.array([number(value, "thresholds") for value in given], dtype=np.float32)
    return Rules(
        multilabel,
        tuple(names),
        None if not unlike else number(unlike.get("threshold"), "unknown threshold"),
        None if not mistake or multilabel else number(mistake.get("threshold"), "likely-mistake threshold"),
        thresholds,
    )


def located(folder: Path, file: str) -> tuple[Path, Path]:
    """(the folder holding the card, the graph) of an export folder or of a registered version's download."""
    if (folder / REGISTERED).is_file() and not (folder / CARD).is_file():
        if file != "onnx":
            raise ServingError("a registered version holds one graph; serve the version of NAME-int8 for int8")
        return folder / REGISTERED_CARDS, folder / FILES["onnx"]
    return folder, folder / FILES[file]


class ExportedModel:
    """The folder's graph with the card's preprocessing and rules: image bytes in, ``predict``'s answers out."""

    def __init__(self, folder: Path, file: str = "onnx", threads: int | None = None) -> None:
        import onnxruntime

        if file not in FILES:
            raise ServingError(f"--format must be one of {', '.join(FILES)}, got {file!r}")
        folder, graph = located(folder, file)
        card = read_card(folder)
        try:
            given = card.get("input")
            self.preprocessing = Preprocessing.from_dict(
                given.get("preprocessing") if isinstance(given, dict) else None
            )
        except (ValueError, UsageError) as error:  # the record's own check says which value
            raise ServingError(f"{folder / CARD}: {error}; export the model again with export.py") from None
        self.rules = rules_of(card)
        if not graph.is_file():
            raise ServingError(f"{graph.parent} has no {graph.name}; export it (export.py --formats {file})")
        options = onnxruntime.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
        try:
            self.session = onnxruntime.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
        except Exception as error:  # onnxruntime's own errors name no common base
            raise ServingError(f"{graph} is not a graph onnxruntime runs ({error}); export it again") from None
        self.outputs = [output.name for output in self.session.get_outputs()]
        self.input = self.session.get_inputs()[0].name
        self.card = card

    def pixels(self, image: bytes) -> np.ndarray:
        """An image file's bytes as the graph's input, (3, S, S) uint8, by the same code ``predict`` decodes with."""
        record = self.preprocessing
        square = decode_image(image, record.image_size, record.resize, record.interpolation, record.crop_pct)
        return np.ascontiguousarray(square.transpose(2, 0, 1))

    def answer(self, batch: np.ndarray, top_k: int = 5) -> list[Answer]:
        """The answers to a batch (N, 3, S, S) of uint8 images, as ``predict`` writes them."""
        found = dict(zip(self.outputs, self.session.run(None, {self.input: batch}), strict=True))
        logits = found["logits"].astype(np.float32)  # calibrated: the temperature is inside the graph
        scores = found.get("score")
        rules = self.rules
        if rules.multilabel:
            probabilities = 1 / (1 + np.exp(-logits))
        else:
            shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
            probabilities = shifted / shifted.sum(axis=1, keepdims=True)
        inside = None
        if scores is not None and rules.unlike_training is not None:
            inside = scores >= np.float32(rules.unlike_training)
        if rules.multilabel:
            given = probabilities >= rules.thresholds
            if inside is not None:
                given &= inside[:, None]
            return answers(probabilities, rules.class_names, inside, labels=given, scores=scores, top_k=top_k)
        sure = None if rules.likely_mistake is None else probabilities.max(axis=1) >= np.float32(rules.likely_mistake)
        answered = sure if inside is None else (inside if sure is None else sure & inside)
        return answers(probabilities, rules.class_names, inside, answered, scores=scores, top_k=top_k)


__all__ = ["BadImageError", "ExportedModel", "ServingError"]
