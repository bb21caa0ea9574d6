{% if cookiecutter.dataset == "images" %}"""Networks for your photos: ``model.backbone`` names one by ``class_path`` (or class name).

Each takes ``num_classes`` first (the model passes it; the config gives the rest) and maps
normalized (N, 3, S, S) images to (N, num_classes) logits. Any ``nn.Module`` with that
constructor plugs in the same way, e.g. ``--model.backbone my_package.MyNet``, or
``classifier_engine.TorchvisionNet`` for any of torchvision's networks.

``TimmNet`` is any of timm's pretrained networks with a new head: the start ``configs/images.yaml``
fine-tunes. ``FastCNN`` (three conv-pool-norm groups, GELU, a max-pooled head) trains from scratch
(``configs/presets/from_scratch.yaml``) at any size, since it pools globally before its head.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

import torch
from torch import Tensor, nn
from typing_extensions import override

from classifier_engine import UsageError, check_choice, weights_from_checkpoint

# What model.backbone is: a class (or function) that builds the network for a number of classes.
BackboneFactory = Callable[[int], nn.Module]
{% else %}"""Networks for square images of 32 px and up: ``model.backbone`` names one by ``class_path`` (or class name).

Each takes ``num_classes`` first (the model passes it; the config gives the rest) and maps
normalized (N, 3, S, S) images to (N, num_classes) logits; each pools globally before its head,
so it takes any size S (its cost grows with S squared). Any ``nn.Module`` with that
constructor plugs in the same way, e.g. ``--model.backbone my_package.MyNet``, or
``classifier_engine.TorchvisionNet`` for any of torchvision's networks.

``FastCNN`` follows the shape of the fastest published CIFAR-10 trainers (three
conv-pool-norm groups, GELU, a max-pooled head): few layers, wide channels, little
memory traffic. ``AirBench`` is that network exactly as airbench94 builds it (Keller Jordan,
"94% on CIFAR-10 in 3.29 seconds on a single GPU", arXiv:2404.00498): a frozen patch-whitening
first layer fitted to the data (by the ``WhiteningFit`` callback), identity-initialized
convolutions, BatchNorm with frozen scales, and a scaled linear head. ``CifarResNet`` is
torchvision's ResNet adapted to 32x32 the usual way: a 3x3 stride-1 stem and no max-pool, so
the first stage still sees the full image.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet
from typing_extensions import override

from classifier_engine import UsageError, check_choice

# What model.backbone is: a class (or function) that builds the network for a number of classes.
BackboneFactory = Callable[[int], nn.Module]
ResNetDepth = Literal[18, 34, 50]
RESNET_LAYOUTS: dict[int, tuple[type[BasicBlock | Bottleneck], list[int]]] = {
    18: (BasicBlock, [2, 2, 2, 2]),
    34: (BasicBlock, [3, 4, 6, 3]),
    50: (Bottleneck, [3, 4, 6, 3]),
}
{% endif %}

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


class FastCNN(nn.Sequential):
    """A stem and three groups of widths (width, 4*width, 4*width); 32 -> 16 -> 8 -> 4 pixels."""

    def __init__(self, num_classes: int, width: int = 64) -> None:
        """Build the network.

        Args:
            num_classes: Number of classes (given by the model).
            width: Channels of the first group; the later groups have 4x.
        """
        _check_width(width)
        widths = (width, 4 * width, 4 * width)
        super().__init__(
            *conv_bn(3, width),
            conv_group(width, widths[0]),
            conv_group(widths[0], widths[1]),
            conv_group(widths[1], widths[2]),
            nn.AdaptiveMaxPool2d(1),
            nn.Flatten(),
            nn.Linear(widths[2], num_classes),
        )


{% if cookiecutter.dataset != "images" %}class PatchWhitening(nn.Conv2d):
    """A 2x2 convolution whose filters whiten image patches: fitted to data once, never trained.

    The filters are the eigenvectors of the patch covariance scaled by 1/sqrt(eigenvalue + eps),
    and their negations (so a following GELU keeps both signs). Only the bias may train.
    """

    def __init__(self, in_channels: int = 3, patch_size: int = 2, eps: float = 5e-4) -> None:
        super().__init__(in_channels, 2 * in_channels * patch_size**2, kernel_size=patch_size, bias=True)
        self.eps = eps
        self.weight.requires_grad_(False)
        self.fitted = False  # set by fit(), or by loading weights that were fitted

    @override
    def forward(self, images: Tensor) -> Tensor:
        if self.training and not self.fitted:
            raise UsageError(
                "the whitening layer of model.backbone was never fitted to data; add the callback "
                "{{ cookiecutter.import_name }}.callbacks.WhiteningFit to trainer.callbacks "
                "(as configs/cifar10_fast.yaml does)"
            )
        return super().forward(images)

    @override
    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self.fitted = prefix + "weight" in state_dict

    @override
    def reset_parameters(self) -> None:
        super().reset_parameters()
        nn.init.zeros_(self.bias)  # airbench starts the (trainable) bias at zero, not PyTorch's uniform draw

    @torch.no_grad()
    def fit(self, images: Tensor, chunk_size: int = 500) -> None:
        """Set the filters from normalized float images (N, C, H, W); float64 on the CPU, so every process agrees."""
        channels, (height, width) = images.shape[1], self.kernel_size
        size = channels * height * width
        covariance = torch.zeros(size, size, dtype=torch.float64)
        count = 0
        for chunk in images.detach().cpu().double().split(chunk_size):
            patches = chunk.unfold(2, height, 1).unfold(3, width, 1)  # (N, C, H', W', h, w)
            patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(-1, size)
            covariance += patches.T @ patches
            count += len(patches)
        eigenvalues, eigenvectors = torch.linalg.eigh(covariance / count)
        # Largest eigenvalue first; eigenvectors are the columns.
        filters = eigenvectors.T.flip(0) / torch.sqrt(eigenvalues.flip(0) + self.eps)[:, None]
        filters = filters.reshape(size, channels, height, width)
        self.weight.copy_(torch.cat((filters, -filters)).to(self.weight.dtype))
        self.fitted = True


class IdentityInitConv(nn.Conv2d):
    """A 3x3 convolution whose first ``in_channels`` filters start as the identity (no residual needed)."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__(in_channels, out_channels, kernel_size=3, padding="same", bias=False)

    @override
    def reset_parameters(self) -> None:
        super().reset_parameters()
        nn.init.dirac_(self.weight.data[: self.in_channels])


def frozen_scale_norm(channels: int) -> nn.BatchNorm2d:
    """BatchNorm whose scale stays 1; only the shift trains (airbench: momentum 0.6 in its convention)."""
    norm = nn.BatchNorm2d(channels, eps=1e-12, momentum=0.4)
    norm.weight.requires_grad_(False)
    return norm


class Scale(nn.Module):
    """Multiply by a constant (airbench's head temperature)."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    @override
    def forward(self, x: Tensor) -> Tensor:
        return x * self.factor


def airbench_group(in_channels: int, out_channels: int) -> nn.Sequential:
    return nn.Sequential(
        IdentityInitConv(in_channels, out_channels),
        nn.MaxPool2d(2),
        frozen_scale_norm(out_channels),
        nn.GELU(),
        IdentityInitConv(out_channels, out_channels),
        frozen_scale_norm(out_channels),
        nn.GELU(),
    )


class AirBench(nn.Sequential):
    """airbench94's network: whitening, groups of widths (width, 4*width, 4*width), 31 -> 15 -> 7 -> 3 -> 1 pixels."""

    def __init__(self, num_classes: int, width: int = 64) -> None:
        """Build the network.

        Args:
            num_classes: Number of classes (given by the model).
            width: Channels of the first group; the later groups have 4x (airbench94: 64).
        """
        _check_width(width)
        widths = (width, 4 * width, 4 * width)
        whitening = PatchWhitening()
        super().__init__(
            whitening,
            nn.GELU(),
            airbench_group(whitening.out_channels, widths[0]),
            airbench_group(widths[0], widths[1]),
            airbench_group(widths[1], widths[2]),
            nn.AdaptiveMaxPool2d(1),  # airbench94's MaxPool2d(3) of its 3x3 map at 32 px; any size above
            nn.Flatten(),
            nn.Linear(widths[2], num_classes, bias=False),
            Scale(1 / 9),
        )


class CifarResNet(ResNet):
    """torchvision's ResNet with a 3x3 stride-1 stem and no max-pool, so the first stage sees all 32x32 pixels."""

    def __init__(self, num_classes: int, depth: ResNetDepth = 18) -> None:
        """Build the network.

        Args:
            num_classes: Number of classes (given by the model).
            depth: 18, 34 (basic blocks) or 50 (bottleneck blocks).
        """
        check_choice("model.backbone.depth", depth, ResNetDepth)
        block, layers = RESNET_LAYOUTS[depth]
        super().__init__(block, layers, num_classes=num_classes)
        self.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        self.maxpool = nn.Identity()


{% else %}DEFAULT_TIMM_NETWORK = "tf_efficientnet_lite1.in1k"
HUB_CONNECT_SECONDS = 5.0  # how long the hub may take to answer a connection before it counts as unreachable
HeadInit = Literal["zero", "timm"]


class TimmNet(nn.Module):
    """Any of timm's networks (pytorch-image-models) by name, from its pretrained weights, with a head for your classes.

    The best start for a folder of your own photos: over a thousand ImageNet-pretrained networks, each
    weight set with its own preprocessing (``pretrained_cfg``: mean and std, interpolation, crop share),
    which ``expected_input`` tells the data before anything is packed. timm replaces the classifier head
    for ``num_classes`` and loads the rest. The weights come from the Hugging Face cache (``HF_HUB_OFFLINE=1``
    works once they are there), or from a local file through timm's own route (``weights_path``). A command that
    loads a checkpoint reads neither: the checkpoint's weights replace them.
    """

    starting_weights_arguments = ("pretrained", "weights_path")  # a checkpoint's own values for them are never used

    def __init__(
        self,
        num_classes: int,
        name: str = DEFAULT_TIMM_NETWORK,
        pretrained: bool = True,
        weights_path: str | None = None,
        drop_rate: float = 0.0,
        drop_path_rate: float | None = None,
        head_init: HeadInit = "zero",
    ) -> None:
        """Build the network.

        Args:
            num_classes: Number of classes (given by the model).
            name: A timm model, with its weights' tag: resnet50.a1_in1k, convnext_tiny.fb_in22k, efficientnet_b0,
                tf_efficientnet_lite0, vit_small_patch16_224.augreg_in21k_ft_in1k, ... (timm.list_pretrained()).
            pretrained: Start from the name's pretrained weights (false: random initialization).
            weights_path: A local weights file (.safetensors, .pth or .bin) of the same network, for machines
                without network access; loaded as timm loads its own.
            drop_rate: Dropout before the classifier head.
            drop_path_rate: Stochastic depth of the residual blocks (networks that have them; null: the network's).
            head_init: The new head's starting weights: zero (every class equally likely at first, as BiT starts)
                or timm (its random initialization).
        """
        super().__init__()
        import timm  # imported when a timm network is asked for: the CLI starts without it

        check_choice("model.backbone.head_init", head_init, HeadInit)
        self.pretrained = pretrained or bool(weights_path)  # FreezeBackbone: a head-first phase only protects weights
        if weights_from_checkpoint():
            pretrained, weights_path = False, None
        _check_timm_name(name, pretrained and not weights_path)
        options: dict[str, Any] = {"num_classes": num_classes, "drop_rate": drop_rate}
        if drop_path_rate is not None:
            options["drop_path_rate"] = drop_path_rate
        if weights_path:
            path = Path(weights_path).expanduser()
            if not path.is_file():
                raise ValueError(f"model.backbone.weights_path={path} does not exist; point it at a weights file")
            _check_weights_file(name, path)
            options["pretrained_cfg_overlay"] = {"file": str(path)}
        try:
            if pretrained and not weights_path:
                _check_hub_reachable(name)
            self.network = timm.create_model(name, pretrained=pretrained or bool(weights_path), **options)
        except Exception as error:  # the hub: no network and no cached copy (OSError, the hub's own errors)
            raise UsageError(
                f"the pretrained weights of {name} are not in the Hugging Face cache and could not be downloaded "
                f"({type(error).__name__}); pass a weights file of it as --model.backbone.weights_path FILE "
                f"(timm.create_model({name!r}, pretrained=True) fills the cache where there is network access), "
                "or train from scratch with --config configs/presets/from_scratch.yaml"
            ) from error
        if head_init == "zero":
            # A random head of a pretrained body starts loud (logits of several units on any photo) and its first
            # gradients shake the body; at zero it starts from "every class equally likely" and learns from there.
            for parameter in self.head().parameters():
                nn.init.zeros_(parameter)

    @staticmethod
    def expected_input(settings: dict[str, Any]) -> dict[str, Any] | None:
        """The preprocessing the named weights were trained with (mean, std, interpolation, crop share), or None.

        Read from timm's registry without building the network, so the data can pack and normalize
        the images as the weights expect before the model exists.
        """
        if not settings.get("pretrained", True) and not settings.get("weights_path"):
            return None
        import timm

        config = timm.models.get_pretrained_cfg(settings.get("name", DEFAULT_TIMM_NETWORK))
        if config is None:
            return None
        return {
            "mean": tuple(config.mean),
            "std": tuple(config.std),
            "interpolation": config.interpolation if config.interpolation in ("bilinear", "bicubic") else "bilinear",
            "crop_pct": float(config.crop_pct),
        }

    @override
    def forward(self, images: Tensor) -> Tensor:
        return self.network(images)

    def head(self) -> nn.Module:
        """The classifier head timm made for ``num_classes``: what trains while the rest is frozen."""
        return self.network.get_classifier()


{% endif %}def head_of(backbone: nn.Module) -> nn.Module:
    """The backbone's classifier head: what its ``head()`` names, else its last linear layer.

    It trains at its own learning rate (``model.backbone_lr_scale``){% if cookiecutter.dataset == "images" %}, and alone
    first while the body is pretrained (``FreezeBackbone``){% endif %}.
    """
    if callable(getattr(backbone, "head", None)):
        return backbone.head()
    linears = [module for module in backbone.modules() if isinstance(module, nn.Linear)]
    if not linears:
        raise ValueError(f"{type(backbone).__name__} has no linear classifier head to train apart from the rest")
    return linears[-1]


{% if cookiecutter.dataset == "images" %}def _check_timm_name(name: str, wants_weights: bool) -> None:
    """One line for a name timm does not know (with the closest it does), or one without pretrained weights."""
    import difflib

    import timm

    if not timm.is_model(name):
        known = timm.list_pretrained() or timm.list_models()
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.5) or difflib.get_close_matches(
            name.split(".")[0], timm.list_models(), n=3, cutoff=0.5
        )
        hint = f"the closest it knows: {', '.join(close)}" if close else "see timm.list_models()"
        raise ValueError(f"model.backbone.name {name!r} is not a timm model; {hint}")
    if wants_weights and not (timm.list_pretrained(name) or timm.list_pretrained(f"{name}.*")):
        tagged = timm.list_pretrained(f"{name.split('.')[0]}.*")[:3]
        offer = f"its pretrained weights: {', '.join(tagged)}" if tagged else "timm.list_pretrained() lists them"
        raise ValueError(
            f"model.backbone.name {name!r} has no pretrained weights in timm; choose a name with weights ({offer}), "
            "or set model.backbone.pretrained false"
        )


def _check_hub_reachable(name: str) -> None:
    """Raise ``ConnectionError`` at once when the weights are not cached and the hub cannot be reached.

    Without it, a machine without network waits half a minute for the hub client's retries (each one
    a warning on the screen) before the same answer.
    """
    import huggingface_hub
    import timm

    repo = getattr(timm.models.get_pretrained_cfg(name), "hf_hub_id", None)
    if not repo or huggingface_hub.constants.HF_HUB_OFFLINE:
        return  # timm's own route answers at once
    files = ("model.safetensors", "pytorch_model.bin", "open_clip_pytorch_model.bin")
    if any(isinstance(huggingface_hub.try_to_load_from_cache(repo, file), str) for file in files):
        return
    endpoint = urlparse(huggingface_hub.constants.ENDPOINT)  # HF_ENDPOINT: the hub or a mirror of it
    host = endpoint.hostname or "huggingface.co"
    port = endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=HUB_CONNECT_SECONDS).close()
    except OSError as error:
        raise ConnectionError(f"{host}:{port} cannot be reached ({error})") from error


def _check_weights_file(name: str, path: Path) -> None:
    """Refuse a file that is not of ``name``'s network (timm itself only logs keys it could not place).

    The classifier may differ (a file of the same network fine-tuned to other classes): it is replaced anyway.
    """
    import timm

    try:
        state = timm.models.load_state_dict(str(path))
    except Exception as error:  # a damaged or foreign file raises many types
        raise ValueError(f"model.backbone.weights_path={path} is not a readable weights file ({error})") from error
    reference = timm.create_model(name, pretrained=False)
    classifier = tuple(f"{head}." for head in _as_tuple(reference.pretrained_cfg.get("classifier")))
    expected = {key: value.shape for key, value in reference.state_dict().items() if not key.startswith(classifier)}
    given = {key: value.shape for key, value in state.items() if not key.startswith(classifier)}
    missing, unexpected = sorted(set(expected) - set(given)), sorted(set(given) - set(expected))
    shapes = [key for key in expected if key in given and given[key] != expected[key]]
    if missing or unexpected or shapes:
        parts = [
            f"{label} {keys[:3]}{' ...' if len(keys) > 3 else ''}"
            for label, keys in (("missing", missing), ("unexpected", unexpected), ("other shapes for", shapes))
            if keys
        ]
        raise ValueError(f"model.backbone.weights_path={path} are not weights of timm's {name} ({'; '.join(parts)})")


def _as_tuple(value: str | tuple[str, ...] | None) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value or ())


{% endif %}def _check_width(width: int) -> None:
    if width < 1:
        raise ValueError(f"model.backbone.width must be a positive integer, got {width}")


def build_backbone(backbone: BackboneFactory, num_classes: int, image_size: int = 32) -> nn.Module:
    """Build the network and run one image of the data's size through it: one that cannot take it fails here."""
    # The class behind a class, a functools.partial of one, or jsonargparse's partial of one.
    candidates = (backbone, getattr(backbone, "func", None), *getattr(backbone, "args", ()))
    name = next((candidate.__name__ for candidate in candidates if isinstance(candidate, type)), "backbone")
    try:
        network = backbone(num_classes)
    except TypeError as error:
        raise ValueError(
            f"model.backbone {name}({num_classes}) cannot be built ({error}); model.backbone must be a class "
            "taking num_classes first"
        ) from error
    if not isinstance(network, nn.Module):
        raise ValueError(f"model.backbone must build an nn.Module, got {type(network).__name__}")
    training = network.training
    try:
        with torch.no_grad():
            logits = network.eval()(torch.zeros(1, 3, image_size, image_size))
    except Exception as error:
        raise ValueError(
            f"model.backbone {type(network).__name__}({num_classes}) cannot classify a (1, 3, {image_size}, "
            f"{image_size}) image ({type(error).__name__}: {error}); model.backbone must be a class taking "
            "num_classes first that takes images of data.image_size"
        ) from error
    finally:
        network.train(training)
    if tuple(logits.shape) != (1, num_classes):
        raise ValueError(
            f"model.backbone {type(network).__name__}({num_classes}) maps a (1, 3, {image_size}, {image_size}) "
            f"image to {tuple(logits.shape)}, not to (1, {num_classes}) logits; model.backbone must be a class taking "
            "num_classes first"
        )
    return network
