"""Any of torchvision's classification networks as model.backbone: ``class_path: classifier_engine.TorchvisionNet``."""

from __future__ import annotations

from pathlib import Path

import torch
import torchvision
from torch import Tensor, nn
from typing_extensions import override

from .starting_weights import weights_from_checkpoint


class TorchvisionNet(nn.Module):
    """Any torchvision classification network by name, optionally from pretrained weights, with a new head.

    The network's last linear layer (its classifier head) is replaced by one for ``num_classes``;
    everything before it keeps the weights. Pretrained weights expect ImageNet's normalization,
    which ``ImageFolderDataModule`` uses; a project's ``FreezeBackbone`` callback trains the new head alone first.
    """

    # They choose the starting weights only: a command that loads a checkpoint neither reads them nor takes them
    # from the checkpoint (models/starting_weights.py).
    starting_weights_arguments = ("weights", "weights_path")

    def __init__(
        self, num_classes: int, name: str = "resnet18", weights: str | None = None, weights_path: str | None = None
    ) -> None:
        """Build the network.

        Args:
            num_classes: Number of classes (given by the model).
            name: A torchvision classification model (torchvision.models.list_models()): resnet18, resnet50,
                efficientnet_b0, convnext_tiny, mobilenet_v3_large, vit_b_16, ...
            weights: torchvision's pretrained weights by name (DEFAULT, IMAGENET1K_V1, ...), downloaded once into
                torch's hub cache; none: random initialization.
            weights_path: A local weights file (a state_dict saved with torch.save) for the unchanged network,
                loaded before the head is replaced; for machines without network access.
        """
        super().__init__()
        if name not in torchvision.models.list_models(torchvision.models):
            raise ValueError(
                f"model.backbone.name {name!r} is not a torchvision classification model; see "
                "torchvision.models.list_models() (e.g. resnet18, efficientnet_b0, convnext_tiny)"
            )
        if weights and weights_path:
            raise ValueError("model.backbone: give weights (a download) or weights_path (a local file), not both")
        self.pretrained = bool(weights or weights_path)  # FreezeBackbone: a head-first phase only protects weights
        if weights_from_checkpoint():
            weights, weights_path = None, None
        try:
            network = torchvision.models.get_model(name, weights=weights)
        except (ValueError, KeyError) as error:
            raise ValueError(f"model.backbone.weights {weights!r} are not weights of {name} ({error})") from error
        except OSError as error:  # no network: URLError is an OSError
            raise ValueError(
                f"model.backbone.weights {weights!r} of {name} could not be downloaded ({error}); download them "
                "where there is network access and pass the file as model.backbone.weights_path"
            ) from error
        if weights_path:
            network.load_state_dict(_read_weights(Path(weights_path).expanduser(), name))
        parent_name, _, head_name = _last_linear(network).rpartition(".")
        parent = network.get_submodule(parent_name)
        old = getattr(parent, head_name)
        setattr(parent, head_name, nn.Linear(old.in_features, num_classes))
        self.network = network
        self.head_name = f"network.{parent_name + '.' if parent_name else ''}{head_name}"

    @override
    def forward(self, images: Tensor) -> Tensor:
        return self.network(images)

    def head(self) -> nn.Module:
        """The classifier head (the new last linear layer): what trains while the rest is frozen."""
        return self.get_submodule(self.head_name)


def _last_linear(network: nn.Module) -> str:
    names = [name for name, module in network.named_modules() if isinstance(module, nn.Linear)]
    if not names:
        raise ValueError(f"model.backbone: {type(network).__name__} has no linear classifier head to replace")
    return names[-1]


def _read_weights(path: Path, name: str) -> dict[str, Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"model.backbone.weights_path={path} does not exist; point it at a saved state_dict") from None
    except Exception as error:  # a damaged or foreign file raises many types
        raise ValueError(f"model.backbone.weights_path={path} is not a readable weights file ({error})") from error
    state = state.get("state_dict", state) if isinstance(state, dict) else state
    if not isinstance(state, dict) or not all(isinstance(value, Tensor) for value in state.values()):
        raise ValueError(f"model.backbone.weights_path={path} does not hold a state_dict of tensors")
    reference = torchvision.models.get_model(name).state_dict()
    missing, unexpected = sorted(set(reference) - set(state)), sorted(set(state) - set(reference))
    shapes = [key for key in reference if key in state and state[key].shape != reference[key].shape]
    if missing or unexpected or shapes:
        if missing or unexpected:
            detail = f"missing {missing[:3]}" if missing else f"unexpected {unexpected[:3]}"
        else:
            detail = f"other shapes for {shapes[:3]}"
        raise ValueError(f"model.backbone.weights_path={path} are not weights of torchvision's {name} ({detail})")
    return state
