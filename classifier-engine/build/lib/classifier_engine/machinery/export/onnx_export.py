"""The network as one self-contained ONNX file (dynamo exporter, weights inside), checked by onnx.checker."""

from __future__ import annotations

from pathlib import Path

import torch

from .contract import INPUT_NAME, OUTPUT_NAME, ExportableClassifier, dynamic_batch, sample_images
from .errors import ExportError


def export_onnx(model: ExportableClassifier, output: Path, opset: int | None = None) -> None:
    """Export the eval-mode network to ``output`` (a staged name: see staging.py) and check the file."""
    try:
        torch.onnx.export(
            model,
            (sample_images(2, size=model.hparams.image_size),),
            str(output),
            dynamo=True,
            external_data=False,
            verbose=False,
            opset_version=opset,
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_shapes=dynamic_batch(),
        )
        check(output)
    except Exception as error:
        raise ExportError(f"ONNX export failed ({type(error).__name__}: {error})") from error


def check(path: Path) -> None:
    import onnx

    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
