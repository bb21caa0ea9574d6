"""The optimizer over a classifier's parameters, with the learning-rate multipliers of fine-tuning recipes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def check_lr_scales(norm_bias_lr_scale: float, backbone_lr_scale: float) -> None:
    """Refuse a multiplier that is not positive when the model is built, before a run starts."""
    for name, scale in (("norm_bias_lr_scale", norm_bias_lr_scale), ("backbone_lr_scale", backbone_lr_scale)):
        if scale <= 0:
            raise ValueError(f"model.{name} must be positive, got {scale}")


def parameter_groups(
    model: nn.Module, head: nn.Module | None, norm_bias_lr_scale: float = 1.0, backbone_lr_scale: float = 1.0
) -> list[Any]:
    """The parameters, or named groups: ``head`` apart from the body, normalization shifts apart from the rest.

    Each group carries ``lr_scale`` and ``weight_decay_scale`` (what ``build_optimizer`` applies);
    the learning-rate monitor logs ``train/lr/<name>`` per group. BatchNorm shifts' weight decay is
    divided by their multiplier, so their decay per step is unchanged.
    """
    check_lr_scales(norm_bias_lr_scale, backbone_lr_scale)
    if norm_bias_lr_scale == 1.0 and backbone_lr_scale == 1.0:
        return list(model.parameters())  # one unnamed group: the learning rate is logged as train/lr
    shifts = {id(m.bias) for m in model.modules() if isinstance(m, NORMS) and m.bias is not None}
    in_head = {id(p) for p in head.parameters()} if head is not None and backbone_lr_scale != 1.0 else None
    groups: dict[str, dict[str, Any]] = {}
    for parameter in model.parameters():
        part = "head" if in_head is None or id(parameter) in in_head else "body"
        lr_scale = 1.0 if part == "head" else backbone_lr_scale
        if norm_bias_lr_scale != 1.0 and id(parameter) in shifts:
            name, lr_scale, decay_scale = f"{part}_norm_biases", lr_scale * norm_bias_lr_scale, 1.0 / norm_bias_lr_scale
        else:
            name, decay_scale = part, 1.0
        group = groups.setdefault(name, {"params": [], "lr_scale": lr_scale, "weight_decay_scale": decay_scale})
        group["params"].append(parameter)
    names = {"head": "main", "head_norm_biases": "norm_biases"} if in_head is None else {}
    return [{**group, "name": names.get(name, name)} for name, group in groups.items()]


def build_optimizer(groups: list[Any], factory: Callable | None) -> torch.optim.Optimizer:
    """``factory(groups)`` (default: SGD, lr 0.1, Nesterov momentum 0.9, weight decay 5e-4), multipliers applied."""
    if factory is None:
        optimizer = torch.optim.SGD(groups, lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    else:
        optimizer = factory(groups)
    for group in optimizer.param_groups:
        group["lr"] *= group.get("lr_scale", 1.0)
        if "weight_decay" in group:
            group["weight_decay"] *= group.get("weight_decay_scale", 1.0)
    return optimizer
