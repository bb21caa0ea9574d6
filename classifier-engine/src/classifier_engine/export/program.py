"""The network as a ``torch.export`` ExportedProgram (``model.pt2``): PyTorch's own deployable format.

TorchScript is deprecated in torch 2.14 (``torch.jit.script``/``trace`` warn, and upstream plans to
make them errors), so it is not shipped; an ExportedProgram is what replaces it: one graph of
ATen operators with the weights, loadable without this project's code
(``torch.export.load("model.pt2").module()``), and the input of AOTInductor and ExecuTorch.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..contract import ClassifierModel
from .contract import dynamic_batch, inference_module, sample_images
from .errors import ExportError


def export_program(model: ClassifierModel, output: Path) -> None:
    """Trace the eval-mode network with a dynamic batch and save it to ``output``."""
    try:
        network = inference_module(model).eval()  # calibrated logits (and the "unknown" score), as the card says
        program = torch.export.export(
            network, (sample_images(2, size=model.image_size),), dynamic_shapes=dynamic_batch()
        )
        strip_source_locations(program)
        # Saved through a file object, the archive's root folder is torch's fixed "archive", not the file's
        # (staged, temporary) name.
        with open(output, "wb") as file:
            torch.export.save(program, file)
    except Exception as error:
        raise ExportError(f"torch.export failed ({type(error).__name__}: {error})") from error


def strip_source_locations(program: torch.export.ExportedProgram) -> None:
    """Drop each node's stack trace (absolute paths of the source and the venv): it names nothing of the machine."""
    for module in program.graph_module.modules():
        if isinstance(module, torch.fx.GraphModule):
            for node in module.graph.nodes:
                node.meta.pop("stack_trace", None)


def load_program(path: Path) -> torch.nn.Module:
    """What a deployment does: the saved program as a callable module, no project code needed."""
    return torch.export.load(str(path)).module()
