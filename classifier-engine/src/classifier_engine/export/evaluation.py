"""Top-1/top-5 accuracy (multi-label: mAP and F1) of a runtime on real test images, and how often two runtimes agree.

Every artifact is judged by the runtime that will serve it (onnxruntime for the ONNX files, the
loaded ExportedProgram for ``.pt2``, the LightningModule for eager), on the same images in the
same batches, so the differences in the model card are the artifacts' and nothing else's.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from .contract import INPUT_NAME, OUTPUT_NAME, SCORE_NAME, sample_images

# uint8 images (N, 3, 32, 32) -> float32 logits (N, classes)
Predictor = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Accuracy:
    """Counts, so that a reader can check the fractions exactly."""

    images: int
    top1_correct: int
    top5_correct: int

    @property
    def top1(self) -> float:
        return self.top1_correct / self.images

    @property
    def top5(self) -> float:
        return self.top5_correct / self.images

    measure = "top-1"

    @property
    def headline(self) -> float:
        """The figure an int8 loss is measured in."""
        return self.top1

    def as_dict(self) -> dict[str, float | int]:
        return {**asdict(self), "top1": self.top1, "top5": self.top5}


@dataclass(frozen=True)
class LabelScores:
    """A multi-label runtime's answers, each label given at its class's threshold on sigmoid(output).

    The counts let a reader recompute micro-F1 exactly; mAP is threshold-free (torchmetrics', macro over
    the classes present in the images).
    """

    images: int
    mAP: float  # noqa: N815 (the name the field knows it by, as the card and the metrics spell it)
    f1_macro: float
    true_positives: int  # labels given that the image has
    labels_given: int
    labels_present: int

    measure = "mAP"

    @property
    def f1_micro(self) -> float:
        total = self.labels_given + self.labels_present
        return 2 * self.true_positives / total if total else 0.0

    @property
    def headline(self) -> float:
        return self.mAP

    def as_dict(self) -> dict[str, float | int]:
        return {**asdict(self), "f1_micro": self.f1_micro}


@dataclass(frozen=True)
class Parity:
    """How closely an artifact's runtime reproduces PyTorch eager, over the tested batch sizes.

    The difference allowed scales with the logits (``tolerance`` times the largest |logit|, at least 1): a
    model whose logits are in the tens, or divided by a small fitted temperature, has rounding errors to
    match. ``floor``: a difference always allowed (the network's own float32 rounding error, measured).
    """

    batch_sizes: tuple[int, ...]
    max_abs_diff: float
    argmax_equal: bool
    tolerance: float
    scale: float = 1.0
    floor: float = 0.0

    @property
    def allowed(self) -> float:
        return max(self.tolerance * max(1.0, self.scale), self.floor)

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= self.allowed and self.argmax_equal

    def as_dict(self) -> dict:
        return {
            "batch_sizes": list(self.batch_sizes),
            "max_abs_logit_diff": self.max_abs_diff,
            "allowed_abs_logit_diff": self.allowed,
            "tolerance": self.tolerance,
            "largest_abs_logit": self.scale,
            "float32_error_floor": self.floor,
            "argmax_equal": self.argmax_equal,
        }

    def describe(self) -> str:
        return describe_parity(self.as_dict())


def describe_parity(parity: dict) -> str:
    """A parity record (``Parity.as_dict()``, as the model card stores it) in words."""
    allowed = parity.get("allowed_abs_logit_diff", parity["tolerance"])  # (cards of 1.2 and before: absolute)
    return (
        f"max |logit diff| {parity['max_abs_logit_diff']:.2e} (allowed {allowed:.2e}) at batch sizes "
        f"{parity['batch_sizes']}, argmax equal: {parity['argmax_equal']}"
    )


PARITY_BATCH_SIZES = (1, 7)


def measure_parity(
    reference: Predictor,
    candidate: Predictor,
    batch_sizes: tuple[int, ...] = PARITY_BATCH_SIZES,
    tolerance: float = 1e-4,
    image_size: int = 32,
    floor: float = 0.0,
) -> Parity:
    """Both runtimes on the same deterministic images, at each batch size (a dynamic batch must really be one)."""
    worst, scale, same_argmax = 0.0, 0.0, True
    for index, batch in enumerate(batch_sizes):
        images = sample_images(batch, seed=index, size=image_size).numpy()
        expected, actual = reference(images), candidate(images)
        worst = max(worst, float(np.abs(actual - expected).max()))
        scale = max(scale, float(np.abs(expected).max()))
        same_argmax &= bool((actual.argmax(axis=1) == expected.argmax(axis=1)).all())
    return Parity(tuple(batch_sizes), worst, same_argmax, tolerance, scale, floor)


def float32_error(module: torch.nn.Module, image_size: int, batch_sizes: tuple[int, ...] = PARITY_BATCH_SIZES) -> float:
    """The largest difference between ``module`` in float32 and in float64 on the parity images (0 if unmeasurable).

    What any correct float32 graph of the network may differ by: another runtime's kernels round differently.
    """
    try:
        precise = copy.deepcopy(module).double()
        worst = 0.0
        with torch.inference_mode():
            for index, batch in enumerate(batch_sizes):
                images = sample_images(batch, seed=index, size=image_size)
                single, double = module(images).double(), precise(images)
                worst = max(worst, float((single - double).abs().max()))
        return worst
    except Exception:  # a network that cannot run in float64: the relative tolerance alone applies
        return 0.0


def all_logits(predict: Predictor, images: np.ndarray, batch_size: int) -> np.ndarray:
    """Logits for every image, ``batch_size`` at a time (a memory map is read batch by batch)."""
    # A copy per batch: memory-mapped rows are read-only, and a runtime may want to own its input.
    parts = [predict(np.array(images[start : start + batch_size])) for start in range(0, len(images), batch_size)]
    return np.concatenate(parts)


def label_scores(logits: np.ndarray, labels: np.ndarray, thresholds: np.ndarray) -> LabelScores:
    """mAP, and F1 with each class given where sigmoid(logit) >= its threshold (the model card's rule)."""
    from torchmetrics.functional.classification import multilabel_average_precision

    probabilities = 1 / (1 + np.exp(-logits.astype(np.float64)))
    present = labels.astype(bool)
    given = probabilities >= np.asarray(thresholds, dtype=np.float64)[None, :]
    hits = given & present
    with_images = present.any(axis=0)
    per_class_ap = multilabel_average_precision(
        torch.from_numpy(probabilities), torch.from_numpy(present.astype(np.int64)), labels.shape[1], average="none"
    ).numpy()
    per_class_f1 = 2 * hits.sum(0) / np.maximum(given.sum(0) + present.sum(0), 1)
    return LabelScores(
        images=len(labels),
        mAP=float(per_class_ap[with_images].mean()) if with_images.any() else 0.0,
        f1_macro=float(per_class_f1.mean()),
        true_positives=int(hits.sum()),
        labels_given=int(given.sum()),
        labels_present=int(present.sum()),
    )


def judge(logits: np.ndarray, labels: np.ndarray, thresholds: np.ndarray | None) -> Accuracy | LabelScores:
    """Top-1/top-5 of class labels (N,), or the multi-label scores of 0/1 rows (N, classes) at ``thresholds``."""
    return label_scores(logits, labels, thresholds) if labels.ndim == 2 else accuracy(logits, labels)


def agreement(a: np.ndarray, b: np.ndarray, thresholds: np.ndarray | None) -> float:
    """Share of images with the same top class (multi-label: of image-class answers that are the same)."""
    if thresholds is None:
        return top1_agreement(a, b)
    cut = np.log(thresholds / (1 - thresholds))  # sigmoid(x) >= t  <=>  x >= logit(t)
    return float(((a >= cut) == (b >= cut)).mean())


def accuracy(logits: np.ndarray, labels: np.ndarray) -> Accuracy:
    k = min(5, logits.shape[1])
    top5 = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    return Accuracy(
        images=len(labels),
        top1_correct=int((top5[:, 0] == labels).sum()),
        top5_correct=int((top5 == labels[:, None]).any(axis=1).sum()),
    )


def top1_agreement(a: np.ndarray, b: np.ndarray) -> float:
    """Share of images on which two runtimes predict the same class."""
    return float((a.argmax(axis=1) == b.argmax(axis=1)).mean())


def onnx_predictor(path: Path, threads: int | None = None) -> Predictor:
    """onnxruntime on the CPU; ``threads`` sets its intra-op threads (default: onnxruntime's choice)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return lambda images: session.run([OUTPUT_NAME], {INPUT_NAME: images})[0]


def file_outputs(path: Path) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray | None]]:
    """Both outputs of an exported file from one pass: its logits and its ``score`` (None where the file has none),
    what the card's rule reads."""
    if path.suffix == ".onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [OUTPUT_NAME, *(SCORE_NAME for output in session.get_outputs() if output.name == SCORE_NAME)]

        def from_onnx(images: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
            logits, *score = session.run(names, {INPUT_NAME: images})
            return logits, score[0] if score else None

        return from_onnx
    program = torch.export.load(str(path)).module()

    def from_program(images: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        with torch.inference_mode():
            output = program(torch.from_numpy(images))
        if isinstance(output, tuple):
            return output[0].float().numpy(), output[1].float().numpy()
        return output.float().numpy(), None

    return from_program


def all_outputs(
    predict: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray | None]], images: np.ndarray, batch_size: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """``file_outputs`` for every image, ``batch_size`` at a time: the logits, and the scores where there are any."""
    parts = [predict(np.array(images[start : start + batch_size])) for start in range(0, len(images), batch_size)]
    logits = np.concatenate([part[0] for part in parts])
    scores = None if not parts or parts[0][1] is None else np.concatenate([part[1] for part in parts])
    return logits, scores


def torch_predictor(module: torch.nn.Module) -> Predictor:
    def predict(images: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            output = module(torch.from_numpy(images))
            return (output[0] if isinstance(output, tuple) else output).float().numpy()  # the logits of (logits, score)

    return predict
