"""Turn a checkpoint into deployable files, each checked and judged on the run's test split, with a model card.

python export.py --ckpt_path runs/<config>/<hash>/checkpoints/last.ckpt [--output_dir DIR] [--formats onnx,int8,pt2]
                 [--register NAME [--alias candidate] [--tracking_uri URI]]

Writes model.onnx (fp32), model.int8.onnx (static int8, calibrated on training images) and
model.pt2 (torch.export), plus model.card.json and model.card.md, into DIR (default: export/
beside the checkpoint); all of them or, if any check fails, none. With --register, the ONNX files
then become new versions of NAME (fp32) and NAME-int8 in MLflow's model registry.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import MISSING, fields, replace
from pathlib import Path

import lightning as L

from ..export.artifacts import FORMATS, ExportOptions, export_artifacts
from ..export.errors import ExportError
from ..export.model_card import int8_change, int8_loss, table
from ..export.quantize import CALIBRATION_METHODS
from ..export.registry import (
    check_registry,
    check_request,
    default_tracking_uri,
    register,
)
from ..foundation.errors import OneLineArgumentParser, exit_with
from ..foundation.noise import silence_known_noise


def formats(value: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in value.split(",") if name.strip())


def parse_args(argv: list[str] | None = None) -> ExportOptions:
    parser = OneLineArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--ckpt_path", type=Path, required=True, help="checkpoint written by main.py fit")
    add("--output_dir", type=Path, help="folder for the files (default: export/ beside the checkpoint)")
    add(
        "--formats",
        type=formats,
        help=f"comma-separated, of {','.join(FORMATS)} (default: all; without int8 for a run that held out no image)",
    )
    add(
        "--data_dir",
        type=Path,
        help="folder of the run's data: its archive, images or packed copy (default: the run's)",
    )
    add("--calibration_images", type=int, help="training images that calibrate int8 (default: %(default)s)")
    add("--calibration_method", choices=CALIBRATION_METHODS, help="int8 activation ranges (default: %(default)s)")
    add("--int8_symmetric", action="store_true", help="symmetric int8 activations, as TensorRT needs them")
    add("--max_int8_drop", type=float, help="most top-1 points int8 may lose against fp32 (default: %(default)s)")
    add("--eval_limit", type=int, help="evaluate the first N test images only (default: the whole split; 0: none)")
    add("--eval_batch_size", type=int, help="images per evaluation batch; memory grows with it (default: %(default)s)")
    add("--opset", type=int, help="ONNX opset (default: the exporter's, at least 18)")
    add(
        "--tolerance",
        type=float,
        help="largest |logit difference| of the fp32 files against PyTorch, as a share of the largest |logit| (at "
        "least 1); default: 1e-4, or ten times the network's own float32 rounding error where that is more",
    )
    add(
        "--config",
        metavar="FILE",
        action="append",
        type=Path,
        help="a config that builds the model and the data, as main.py's --config (repeatable; default: the project's "
        "own). A config is code: pass a run's config.yaml only if you trust it (SECURITY.md)",
    )
    add("--register", metavar="NAME", help="register the ONNX files in MLflow as NAME (fp32) and NAME-int8")
    add("--alias", help="point this alias of the registered models at the new versions, e.g. candidate")
    add("--tracking_uri", help="the MLflow store (default: the run's MLflow preset's, else sqlite:///runs/mlflow.db)")
    # The defaults are ExportOptions' own, stated once there.
    parser.set_defaults(
        **{field.name: field.default for field in fields(ExportOptions) if field.default is not MISSING}
    )
    parser.set_defaults(config=None)  # argparse appends to the default's list
    options = vars(parser.parse_args(argv))
    options["config"] = tuple(options["config"] or ())
    return ExportOptions(**options)


def main(
    model_class: type[L.LightningModule],
    experiment: str,
    argv: list[str] | None = None,
    default_config: Path | None = None,
) -> int:
    """``python export.py ...`` of the project's LightningModule; ``experiment``: MLflow's, for --register;
    ``default_config``: the project's, which builds the model (``--config`` files go on top)."""
    silence_known_noise()
    options = parse_args(argv)
    try:
        if options.alias and not options.register:
            raise ExportError("--alias names an alias of a registered model; add --register NAME")
        if options.register:  # refused now rather than after the export's minutes of work
            if not {"onnx", "int8"} & set(options.asked_formats()):
                raise ExportError("--register registers the ONNX files; add onnx or int8 to --formats")
            check_request(options.register, options.alias)
            options = replace(
                options, tracking_uri=options.tracking_uri or default_tracking_uri(options.ckpt_path, options.config)
            )
            check_registry(options.tracking_uri)
        exported = export_artifacts(options, model_class, default_config)
    except Exception as error:  # a user's mistake or a failed check: one line (FULL_ERROR=1: the traceback)
        exit_with(error)
    report(exported.card, exported.written)
    if options.register:
        try:
            versions = register(
                options.register,
                options.alias,
                options.tracking_uri,
                options.ckpt_path,
                options.folder(),
                exported.card,
                exported.examples,
                experiment,
                options.config,
            )
        except Exception as error:
            exit_with(error)
        for version in versions:
            print(f"registered {version.name} version {version.version} in {options.tracking_uri}: {version.uri()}")
    return 0


def report(card: dict, written: list[Path]) -> None:
    print(table(card))
    if card["int8"]:
        int8 = card["int8"]
        measure, drop, agreement = int8_loss(int8)
        print(f"int8 {int8_change(drop)} of {measure} against fp32, {agreement}")
    if card["evaluation"].get("skipped"):
        print(f"accuracy not measured: {card['evaluation']['skipped']}")
    print(f"wrote {', '.join(str(path) for path in written)}")


def run(model_class: type[L.LightningModule], experiment: str) -> None:
    """The command as typed; exits with its code."""
    sys.exit(main(model_class, experiment))
