"""fp32 ONNX -> int8 ONNX: onnxruntime's static post-training quantization, calibrated on the run's training images.

QDQ format (QuantizeLinear/DequantizeLinear pairs around each quantized operator), which both
onnxruntime and TensorRT read; weights int8, symmetric, per output channel. Activations:

- asymmetric uint8 (the default) for onnxruntime on CPUs: the full 8 bits cover a ReLU/GELU
  output that is almost all positive;
- symmetric int8 (``symmetric=True``) for TensorRT, which only takes symmetric activations.

Calibration runs the fp32 model on ``images`` (training images, never test images) and records
each activation's range: MinMax (the observed extremes), Percentile (clips the rarest 0.001 %)
or Entropy (the range that keeps the histogram's information).
"""

from __future__ import annotations

import contextlib
import io
import math
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, get_args

import numpy as np
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process

from .contract import INPUT_NAME, SCORE_NAME
from .errors import ExportCheckError

CalibrationMethodName = Literal["minmax", "percentile", "entropy"]
CALIBRATION_METHODS: tuple[str, ...] = get_args(CalibrationMethodName)
CALIBRATION_BATCH = 16  # images whose activations calibration holds at once


@dataclass(frozen=True)
class Calibration:
    """How the int8 model's activation ranges were found (recorded in the model card)."""

    images: int
    method: CalibrationMethodName
    symmetric_activations: bool
    source: str
    per_channel: bool = True
    quant_format: str = "QDQ"

    def as_dict(self) -> dict:
        return {
            **asdict(self),
            "activations": "int8 symmetric" if self.symmetric_activations else "uint8 asymmetric",
            "weights": "int8 symmetric, per output channel" if self.per_channel else "int8 symmetric, per tensor",
        }


class ImageBatches:
    """onnxruntime's CalibrationDataReader over uint8 images: ``get_next()`` gives a feed dict, then None.

    ``len()`` and ``set_range()`` (in batches) let onnxruntime calibrate one batch at a time (``CalibStridedMinMax``,
    which every method honours): it holds every activation of what it calibrates at once, and 271 photos at
    240 px took 12 GB with MinMax, over 18 GB with Percentile, where a batch at a time takes a batch's worth.
    """

    def __init__(self, images: np.ndarray, batch_size: int = CALIBRATION_BATCH) -> None:
        self.images, self.batch_size = images, batch_size
        self.set_range(0, len(self))

    def __len__(self) -> int:
        return math.ceil(len(self.images) / self.batch_size)

    def set_range(self, start_index: int, end_index: int) -> None:
        self._batches = self._iterate(start_index, min(end_index, len(self)))

    def _iterate(self, start: int, end: int) -> Iterator[dict[str, np.ndarray]]:
        for batch in range(start, end):
            yield {INPUT_NAME: self.images[batch * self.batch_size : (batch + 1) * self.batch_size]}

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._batches, None)

    def rewind(self) -> None:
        self.set_range(0, len(self))


def quantize_int8(fp32_path: Path, output: Path, images: np.ndarray, calibration: Calibration) -> None:
    """Write the int8 QDQ model of ``fp32_path`` to ``output``."""
    methods = {
        "minmax": CalibrationMethod.MinMax,
        "percentile": CalibrationMethod.Percentile,
        "entropy": CalibrationMethod.Entropy,
    }
    try:
        _quantize(fp32_path, output, images, calibration, methods[calibration.method])
    except Exception as error:  # onnxruntime's tools raise plain exceptions from deep inside
        raise ExportCheckError(
            f"int8 quantization failed ({type(error).__name__}: {error}); export without it: --formats onnx,pt2"
        ) from error


def _quantize(
    fp32_path: Path, output: Path, images: np.ndarray, calibration: Calibration, method: CalibrationMethod
) -> None:
    with tempfile.TemporaryDirectory(prefix="quantize-") as work:
        prepared = Path(work) / "prepared.onnx"
        # ONNX's own shape inference and graph optimization; onnxruntime's symbolic shape inference is
        # for transformer graphs and trips over the exporter's Reshape of a dynamic batch.
        quant_pre_process(str(fp32_path), str(prepared), skip_symbolic_shape=True)
        kept_in_float = score_nodes(prepared)
        # The calibrators print progress ("Collecting tensor data ...") to stdout: the export's own table is the output.
        with contextlib.redirect_stdout(io.StringIO()):
            quantize_static(
                str(prepared),
                str(output),
                ImageBatches(images),
                quant_format=QuantFormat.QDQ,
                per_channel=calibration.per_channel,
                activation_type=QuantType.QInt8 if calibration.symmetric_activations else QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                calibrate_method=method,
                nodes_to_exclude=kept_in_float,
                extra_options={
                    "ActivationSymmetric": calibration.symmetric_activations,
                    "WeightSymmetric": True,
                    # BatchNorm layers that follow a pooling (not folded into a convolution) keep
                    # one scale per channel, on the only axis their 1-D parameters have.
                    "QDQOpTypePerChannelSupportToAxis": {"BatchNormalization": 0},
                    "CalibStridedMinMax": 1,  # one batch of ImageBatches at a time, whatever the method
                },
            )


def score_nodes(path: Path) -> list[str]:
    """The nodes that compute the "unknown" score from the features, left in float: quantized, the product with
    the bank of training features moved the score by a tenth of its spread on the tests' network, and the card's
    threshold was fitted in float. They are the graph's own, outside the network's modules (``name_scopes``)."""
    import onnx

    model = onnx.load(str(path))
    if SCORE_NAME not in [output.name for output in model.graph.output]:
        return []
    outside = []
    for node in model.graph.node:
        scopes = next((prop.value for prop in node.metadata_props if prop.key == "pkg.torch.onnx.name_scopes"), "")
        if scopes and not scopes.startswith("['', 'network'"):
            outside.append(node.name)
    return outside
