"""One export: every asked-for artifact built, checked against PyTorch, judged on the test split, and carded.

Order of work: the checkpoint and (where needed) the data are found before anything is
written; each file is built under a staged name (staging.py) and checked at once; then every
runtime classifies the same test images; the int8 model's loss against fp32 is held to its
limit; only then are the files and the card renamed into place, together.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, get_args

import numpy as np

from ..contract import ClassifierModel
from ..foundation.files import sha256
from ..models.cost import model_cost
from .contract import exported_network, sample_images
from .errors import ExportCheckError, ExportError, Int8DropError
from .evaluation import (
    Accuracy,
    LabelScores,
    Parity,
    Predictor,
    agreement,
    all_logits,
    all_outputs,
    file_outputs,
    float32_error,
    judge,
    measure_parity,
    onnx_predictor,
    torch_predictor,
)
from .model_card import CARD_JSON, CARD_MARKDOWN, build_card, write_card
from .model_loading import LoadedModel, load_model
from .onnx_export import export_onnx
from .program import export_program, load_program
from .quantize import Calibration, CalibrationMethodName, quantize_int8
from .run_data import MissingDataError, RunData, load_run_data
from .staging import StagedFiles

Format = Literal["onnx", "int8", "pt2"]
FORMATS: tuple[str, ...] = get_args(Format)
FILE_NAMES = {"onnx": "model.onnx", "int8": "model.int8.onnx", "pt2": "model.pt2"}
RUNTIMES = {
    "onnx": "onnxruntime CPUExecutionProvider",
    "int8": "onnxruntime CPUExecutionProvider",
    "pt2": "torch.export.load(...).module()",
}
DESCRIPTIONS = {
    "onnx": "ONNX, float32",
    "int8": "ONNX, int8 QDQ (static post-training quantization)",
    "pt2": "torch.export ExportedProgram",
}


@dataclass(frozen=True)
class ExportOptions:
    """What ``export.py`` was asked to do (its command-line options)."""

    ckpt_path: Path
    output_dir: Path | None = None
    formats: tuple[str, ...] | None = None  # None: all, but a run that held out no image cannot judge int8
    data_dir: Path | None = None
    calibration_images: int = 512
    calibration_method: CalibrationMethodName = "minmax"
    int8_symmetric: bool = False
    max_int8_drop: float = 1.0
    eval_limit: int | None = None
    eval_batch_size: int = 64  # activations of a 240-px network: about 12 MB an image in onnxruntime
    opset: int | None = None
    tolerance: float | None = None
    register: str | None = None
    alias: str | None = None
    tracking_uri: str | None = None
    config: tuple[Path, ...] = ()  # --config: what builds the model and the data (default: the project's)
    int8_optional: bool = False  # int8 losing more than max_int8_drop is left out rather than failing the export

    def asked_formats(self) -> tuple[str, ...]:
        """The formats named, else all of them (``settled_formats`` leaves out what the run cannot judge)."""
        return FORMATS if self.formats is None else self.formats

    def folder(self) -> Path:
        """Where the files go: ``--output_dir``, or an ``export/`` folder beside the checkpoint."""
        return self.output_dir or self.ckpt_path.parent / "export"


@dataclass(frozen=True)
class Exported:
    """What an export wrote: the card, the files, and a few of the images it judged (a registry's input example)."""

    card: dict
    written: list[Path]
    examples: np.ndarray
    int8_left_out: Int8DropError | None = None  # with ``int8_optional``: why int8 was not shipped


@dataclass
class Built:
    """One artifact under its staged name, with what was measured of it."""

    name: str
    path: Path
    predictor: Predictor
    parity: Parity | None = None
    accuracy: Accuracy | LabelScores | None = None
    logits: np.ndarray | None = field(default=None, repr=False)
    unlike_training: int | None = None  # judged images whose "score" output is below the card's threshold


def check_options(options: ExportOptions) -> None:
    asked = options.asked_formats()
    unknown = [name for name in asked if name not in FORMATS]
    if unknown or not asked:
        raise ExportError(f"--formats {','.join(asked)}: choose from {','.join(FORMATS)} (comma-separated)")
    if options.calibration_images < 1:
        raise ExportError(f"--calibration_images must be at least 1, got {options.calibration_images}")
    if options.eval_limit is not None and options.eval_limit < 0:
        raise ExportError(f"--eval_limit must be 0 or more, got {options.eval_limit}")
    if options.eval_limit == 0 and "int8" in asked:
        raise ExportError("--eval_limit 0 skips the evaluation the int8 limit needs; give a count, or drop int8")
    if options.eval_batch_size < 1:
        raise ExportError(f"--eval_batch_size must be at least 1, got {options.eval_batch_size}")
    if options.max_int8_drop < 0:
        raise ExportError(f"--max_int8_drop is in points of top-1 and must be 0 or more, got {options.max_int8_drop}")
    folder = options.folder()
    existing = next((p for p in [folder, *folder.parents] if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise ExportError(f"cannot write to {folder}: {existing} is a file; choose another --output_dir")


def find_data(options: ExportOptions, loaded: LoadedModel) -> tuple[RunData | None, str | None]:
    """The run's data, or why evaluation is skipped; missing data is an error where int8 or ``--data_dir`` asks."""
    if options.eval_limit == 0:
        return None, "--eval_limit 0"
    asked = options.asked_formats()
    purpose = "int8 calibration" if "int8" in asked else "evaluation on the test split"
    try:
        data = load_run_data(loaded, options.ckpt_path, loaded.model.class_names, options.data_dir, purpose)
    except MissingDataError as error:
        if "int8" in asked or options.data_dir is not None:
            raise
        return None, f"no data: {error}"
    if len(data.held_out.labels):
        return data, None
    # A run that held no image out (a cross-validation's final model): nothing to judge it, or int8 against fp32, on.
    if options.formats is not None and "int8" in options.formats:
        raise MissingDataError(
            "the run trained on every image and holds none out to measure what int8 loses against fp32; leave int8 "
            "out of --formats (the default does), or hold out a test split (data.test_fraction) when you train"
        )
    return None, "the run held out no images (it trained on every one); the card's cross-validated figures stand for it"


# By default, an fp32 file may differ from PyTorch by 1e-4 of the largest logit, or by ten times the network's own
# float32 rounding error where that is more (--tolerance: exactly that share of the largest logit).
DEFAULT_TOLERANCE, ROUNDING_MARGIN = 1e-4, 10.0


def parity_floor(options: ExportOptions, model: ClassifierModel) -> float:
    if options.tolerance is not None:
        return 0.0
    return ROUNDING_MARGIN * float32_error(exported_network(model).eval(), model.image_size)


def check_parity(built: Built, reference: Predictor, options: ExportOptions, image_size: int, floor: float) -> None:
    tolerance = options.tolerance if options.tolerance is not None else DEFAULT_TOLERANCE
    built.parity = measure_parity(reference, built.predictor, tolerance=tolerance, image_size=image_size, floor=floor)
    if not built.parity.ok:
        raise ExportCheckError(
            f"{FILE_NAMES[built.name]} does not reproduce PyTorch: {built.parity.describe()}; nothing was written "
            "(a looser --tolerance accepts it, if the difference is acceptable for your use)"
        )


def build(options: ExportOptions, model: ClassifierModel, data: RunData | None, staged: StagedFiles, work: Path):
    """Each artifact, staged and checked, in the order it depends on (int8 is made from the fp32 ONNX)."""
    eager = torch_predictor(exported_network(model).eval())  # what every file computes: calibrated logits
    floor = parity_floor(options, model) if {"onnx", "pt2"} & set(options.formats) else 0.0
    built: dict[str, Built] = {}
    calibration = None
    if "onnx" in options.formats or "int8" in options.formats:
        fp32 = staged.path(FILE_NAMES["onnx"]) if "onnx" in options.formats else work / FILE_NAMES["onnx"]
        export_onnx(model, fp32, opset=options.opset)
        built["onnx"] = Built("onnx", fp32, onnx_predictor(fp32))
        check_parity(built["onnx"], eager, options, model.image_size, floor)
    if "int8" in options.formats:
        assert data is not None  # find_data refuses int8 without data
        images = data.calibration_images(options.calibration_images)
        calibration = Calibration(len(images), options.calibration_method, options.int8_symmetric, "training")
        int8 = staged.path(FILE_NAMES["int8"])
        quantize_int8(built["onnx"].path, int8, images, calibration)
        built["int8"] = Built("int8", int8, onnx_predictor(int8))
    if "pt2" in options.formats:
        program = staged.path(FILE_NAMES["pt2"])
        export_program(model, program)
        built["pt2"] = Built("pt2", program, torch_predictor(load_program(program)))
        check_parity(built["pt2"], eager, options, model.image_size, floor)
    return built, calibration


def label_thresholds(model: ClassifierModel) -> np.ndarray | None:
    """A multi-label model's thresholds (on sigmoid of the exported output), None for one label per image."""
    calibration = model.calibration
    if not calibration.multilabel:
        return None
    return calibration.thresholds.detach().cpu().numpy().astype(np.float64)


def evaluate(
    options: ExportOptions, model: ClassifierModel, data: RunData, built: dict[str, Built]
) -> Accuracy | LabelScores:
    """Every runtime on the same held-out images; returns PyTorch eager's accuracy (multi-label: its scores)."""
    held_out = data.held_out
    count = len(held_out.labels) if options.eval_limit is None else min(options.eval_limit, len(held_out.labels))
    images, labels = held_out.images[:count], np.asarray(held_out.labels[:count])
    thresholds = label_thresholds(model) if labels.ndim == 2 else None
    unknown_below = float(model.calibration.domain_threshold)
    for artifact in built.values():
        artifact.logits, scores = all_outputs(file_outputs(artifact.path), images, options.eval_batch_size)
        artifact.accuracy = judge(artifact.logits, labels, thresholds)
        if scores is not None:  # the card's rule, counted on the file's own second output
            artifact.unlike_training = int((scores < unknown_below).sum())
    return judge(
        all_logits(torch_predictor(exported_network(model).eval()), images, options.eval_batch_size), labels, thresholds
    )


def int8_report(
    options: ExportOptions, built: dict[str, Built], calibration: Calibration, thresholds: np.ndarray | None
) -> dict:
    """How much int8 loses against fp32, in top-1 points (multi-label: mAP points), and how often they agree."""
    fp32, int8 = built["onnx"], built["int8"]
    drop = 100 * (fp32.accuracy.headline - int8.accuracy.headline)
    key = "top1" if thresholds is None else "mAP"
    report = {
        f"{key}_drop_points": drop,
        "max_drop_points": options.max_int8_drop,
        f"{'top1' if thresholds is None else 'label'}_agreement": agreement(fp32.logits, int8.logits, thresholds),
        "calibration": calibration.as_dict(),
    }
    if drop > options.max_int8_drop:
        measure = fp32.accuracy.measure
        fewer = getattr(fp32.accuracy, "top1_correct", 0) - getattr(int8.accuracy, "top1_correct", 0)
        counted = f", {fewer} fewer right" if thresholds is None else ""  # a small split: a photo is a point or more
        raise Int8DropError(
            f"the int8 model loses {drop:.2f} points of {measure} against fp32 ({100 * int8.accuracy.headline:.2f} % "
            f"vs {100 * fp32.accuracy.headline:.2f} % on {fp32.accuracy.images} test images{counted}; limit "
            f"--max_int8_drop {options.max_int8_drop}); nothing was written: try more --calibration_images (now "
            f"{calibration.images}), another --calibration_method (minmax, percentile, entropy), or ship fp32 with "
            "--formats onnx,pt2",
            drop,
            options.max_int8_drop,
        )
    return report


def describe(artifact: Built) -> dict:
    return {
        "file": FILE_NAMES[artifact.name],
        "format": DESCRIPTIONS[artifact.name],
        "runtime": RUNTIMES[artifact.name],
        "bytes": artifact.path.stat().st_size,
        "sha256": sha256(artifact.path),
        "parity": artifact.parity.as_dict() if artifact.parity else None,
        "accuracy": artifact.accuracy.as_dict() if artifact.accuracy else None,
        "unlike_training_images": artifact.unlike_training,  # answered "unknown" by its score output
    }


def evaluation_record(
    options: ExportOptions, data: RunData | None, skipped: str | None, eager: Accuracy | LabelScores | None
):
    if data is None or eager is None:
        return {"skipped": skipped}
    return {
        "dataset": data.held_out.dataset,
        "split": data.held_out.split,
        "images": eager.images,
        "split_images": len(data.held_out.labels),
        "data_dir": data.held_out.source,
        "batch_size": options.eval_batch_size,
    }


def example_images(data: RunData | None, image_size: int, count: int = 3) -> np.ndarray:
    """The first judged images, or the contract's sample images when the export had no data."""
    if data is not None and len(data.held_out.labels):
        return np.ascontiguousarray(data.held_out.images[:count])
    return sample_images(count, size=image_size).numpy()


def export_artifacts(
    options: ExportOptions, model_class: type, default_config: Path | None, options_of_config: tuple[str, ...] = ()
) -> Exported:
    """Export the project's ``model_class`` from the checkpoint (nothing is written if anything fails).

    The model and the data are built from ``default_config``, then ``--config`` (``options.config``), then
    ``options_of_config`` (a command's own options, e.g. a cross-validation's), with what the checkpoint admits.
    """
    check_options(options)
    args = [*(option for path in options.config for option in ("--config", str(path))), *options_of_config]
    loaded = load_model(options.ckpt_path, model_class, default_config, args)
    return export_model(options, loaded.model, loaded.checkpoint, *find_data(options, loaded))


def settled_formats(options: ExportOptions, data: RunData | None) -> ExportOptions:
    """The formats to write: those named, else all of them, less int8 where there are no held-out images to judge
    its loss against fp32 on (``find_data`` has refused every other way of having none by then)."""
    if options.formats is not None:
        return options
    return replace(options, formats=FORMATS if data is not None else tuple(name for name in FORMATS if name != "int8"))


def export_model(
    options: ExportOptions, model: ClassifierModel, checkpoint: dict, data: RunData | None, skipped: str | None
) -> Exported:
    """Export a loaded model (``checkpoint``: what its card reads; ``data``: the run's, or why it is not judged)."""
    options = settled_formats(options, data)
    with StagedFiles(options.folder()) as staged, tempfile.TemporaryDirectory(prefix="export-") as work:
        built, calibration = build(options, model, data, staged, Path(work))
        eager = evaluate(options, model, data, built) if data is not None else None
        thresholds = label_thresholds(model) if data is not None and np.ndim(data.held_out.labels) == 2 else None
        int8, left_out = None, None
        try:
            int8 = int8_report(options, built, calibration, thresholds) if calibration is not None else None
        except Int8DropError as error:
            if not options.int8_optional:
                raise
            left_out = error  # the fp32 files are already built and judged: they ship without it
            staged.drop(FILE_NAMES[built.pop("int8").name])
        shipped = {name: describe(artifact) for name, artifact in built.items() if name in options.formats}
        card = build_card(
            model,
            checkpoint,
            options.ckpt_path,
            model_cost(exported_network(model), model.image_size),
            shipped,
            eager.as_dict() if eager else None,
            evaluation_record(options, data, skipped, eager),
            int8,
        )
        write_card(card, staged.path(CARD_JSON), staged.path(CARD_MARKDOWN))
        return Exported(card, staged.commit(), example_images(data, model.image_size), left_out)
