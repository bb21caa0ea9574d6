"""Backbones for 32x32 images, built by name.

``fastcnn`` follows the shape of the fastest published CIFAR-10 trainers (three
conv-pool-norm groups, GELU, a max-pooled head): few layers, wide channels, little
memory traffic. The torchvision ResNets are adapted to 32x32 the usual way: a 3x3
stride-1 stem and no max-pool, so the first stage still sees the full image.
"""

from __future__ import annotations

from typing import Literal

from torch import nn
from torchvision.models import resnet18, resnet34, resnet50

BackboneName = Literal["fastcnn", "resnet18", "resnet34", "resnet50"]
RESNETS = {"resnet18": resnet18, "resnet34": resnet34, "resnet50": resnet50}
RESNET_WIDTH = 64


def conv_bn(in_channels: int, out_channels: int) -> list[nn.Module]:
    return [
        nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.GELU(),
    ]


def conv_group(in_channels: int, out_channels: int) -> nn.Sequential:
    """Conv, halve the resolution, conv: the unit the fast CIFAR trainers stack three times."""
    first, *rest = conv_bn(in_channels, out_channels)
    return nn.Sequential(first, nn.MaxPool2d(2), *rest, *conv_bn(out_channels, out_channels))


def fastcnn(num_classes: int, width: int) -> nn.Sequential:
    """A stem and three groups of widths (width, 4*width, 4*width); 32 -> 16 -> 8 -> 4 pixels."""
    widths = (width, 4 * width, 4 * width)
    return nn.Sequential(
        *conv_bn(3, width),
        conv_group(width, widths[0]),
        conv_group(widths[0], widths[1]),
        conv_group(widths[1], widths[2]),
        nn.AdaptiveMaxPool2d(1),
        nn.Flatten(),
        nn.Linear(widths[2], num_classes),
    )


def cifar_resnet(name: str, num_classes: int) -> nn.Module:
    model = RESNETS[name](num_classes=num_classes)
    model.conv1 = nn.Conv2d(3, RESNET_WIDTH, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


def build_backbone(name: BackboneName, num_classes: int, width: int = 64) -> nn.Module:
    """Return a network mapping normalized (N, 3, 32, 32) images to (N, num_classes) logits."""
    if name == "fastcnn":
        if width < 1:
            raise ValueError(f"model.width must be a positive integer, got {width}")
        return fastcnn(num_classes, width)
    if name in RESNETS:
        if width != RESNET_WIDTH:
            raise ValueError(
                f"model.width={width} cannot apply to {name}: torchvision ResNets have a fixed base width "
                f"of {RESNET_WIDTH}; leave model.width at {RESNET_WIDTH} or use model.backbone fastcnn"
            )
        return cifar_resnet(name, num_classes)
    raise ValueError(f"unknown model.backbone {name!r}; choose one of fastcnn, {', '.join(RESNETS)}")
