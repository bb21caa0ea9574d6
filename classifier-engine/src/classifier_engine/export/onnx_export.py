"""The network as one self-contained ONNX file (dynamo exporter, weights inside), checked by onnx.checker."""

from __future__ import annotations

from pathlib import Path

import torch

from ..contract import ClassifierModel
from .contract import INPUT_NAME, dynamic_batch, inference_module, output_names, sample_images
from .errors import ExportError


def export_onnx(model: ClassifierModel, output: Path, opset: int | None = None) -> None:
    """Export the eval-mode network to ``output`` (a staged name: see staging.py) and check the file."""
    try:
        module = inference_module(model).eval()  # calibrated logits (and the "unknown" score), as the card says
        torch.onnx.export(
            module,
            (sample_images(2, size=model.image_size),),
            str(output),
            dynamo=True,
            external_data=False,
            verbose=False,
            opset_version=opset,
            input_names=[INPUT_NAME],
            output_names=output_names(module),
            dynamic_shapes=dynamic_batch(),
        )
        strip_source_locations(output)
        check(output)
    except Exception as error:
        raise ExportError(f"ONNX export failed ({type(error).__name__}: {error})") from error


# Node metadata the exporter writes that names this machine's files (absolute paths of the source and the venv).
MACHINE_METADATA = ("pkg.torch.onnx.stack_trace",)


def strip_source_locations(path: Path) -> None:
    """Drop the exporter's stack traces from every node: a shipped file names nothing of the machine it was made on.

    (The other metadata, the module and class names a node came from, is kept: it helps read the graph.)
    """
    import onnx

    model = onnx.load(str(path))
    graphs = [
        model.graph,
        *(
            attribute.g
            for node in model.graph.node
            for attribute in node.attribute
            if attribute.type == onnx.AttributeProto.GRAPH
        ),
    ]
    nodes = [node for graph in graphs for node in graph.node] + [n for f in model.functions for n in f.node]
    for node in nodes:
        kept = [prop for prop in node.metadata_props if prop.key not in MACHINE_METADATA]
        del node.metadata_props[:]
        node.metadata_props.extend(kept)
    onnx.save(model, str(path))


def check(path: Path) -> None:
    import onnx

    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
