"""Parameters, MACs and FLOPs per image, counted without touching the model (for training and export alike).

thop counts multiply-accumulates by exact module type, so a subclass of a layer it knows
(airbench's whitening and identity-initialized convolutions are ``nn.Conv2d`` subclasses) is
counted with its nearest known base class' rule; unknown layers count zero. It also leaves
``total_ops``/``total_params`` buffers on every module it visits, so it always profiles a deep
copy. PyTorch's own ``FlopCounterMode`` counts FLOPs by operator; the tests compare the two for
every backbone.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


@dataclass(frozen=True)
class ModelCost:
    """What one image costs to classify."""

    params: int
    macs_per_image: int
    flops_per_image: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def describe(self) -> str:
        return (
            f"{self.params / 1e6:.3g} M parameters, {self.macs_per_image / 1e6:.3g} M MACs "
            f"({self.flops_per_image / 1e9:.3g} GFLOPs) per image"  # three digits, however small the network
        )


def example_images(image_size: int = 32, batch: int = 1) -> torch.Tensor:
    return torch.zeros(batch, 3, image_size, image_size, dtype=torch.uint8)


def thop_macs_and_params(model: nn.Module, image_size: int = 32) -> tuple[int, int]:
    """thop's MAC and parameter counts for one image, on a copy of ``model``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # thop imports distutils' LooseVersion
        import thop

    from thop.profile import register_hooks

    probe = copy.deepcopy(model).cpu().eval()
    inherited = {}
    for module in probe.modules():
        kind = type(module)
        if kind not in register_hooks:
            known = next((base for base in kind.__mro__[1:] if base in register_hooks), None)
            if known is not None:
                inherited[kind] = register_hooks[known]
    macs, params = thop.profile(probe, inputs=(example_images(image_size),), custom_ops=inherited, verbose=False)
    return int(macs), int(params)


def torch_flops(model: nn.Module, image_size: int = 32) -> int:
    """FLOPs of one image's forward pass, by PyTorch's operator-level counter."""
    probe = copy.deepcopy(model).cpu().eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        probe(example_images(image_size))
    return int(counter.get_total_flops())


def model_cost(model: nn.Module, image_size: int = 32) -> ModelCost:
    """What one ``image_size`` x ``image_size`` image costs ``model``."""
    macs, _ = thop_macs_and_params(model, image_size)
    params = sum(p.numel() for p in model.parameters())
    return ModelCost(params=params, macs_per_image=macs, flops_per_image=2 * macs)
