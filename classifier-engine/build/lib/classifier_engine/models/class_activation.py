"""Where the network looked for its answer: Grad-CAM (captum's) on the last convolutional stage of any backbone."""

from __future__ import annotations

import numpy as np
import torch
from captum.attr import LayerAttribution, LayerGradCam
from torch import nn


def activation_layer(backbone: nn.Module, image_size: int) -> tuple[nn.Module | None, str]:
    """(the layer Grad-CAM reads, its name), or (None, why the network has none).

    timm networks name their stages (``feature_info``): the last one. Any other network: the last
    module to finish with a spatial map (N, C, H, W, larger than 1 x 1) in a forward pass, which is its
    last convolutional stage as a whole (the pooling before the head makes 1 x 1). A transformer's
    last stage gives tokens, and its patch embedding says nothing about the decision: no layer.
    """
    network = getattr(backbone, "network", backbone)
    finished: list[tuple[str, torch.Size]] = []
    hooks = [
        module.register_forward_hook(lambda _m, _i, out, name=name: finished.append((name, getattr(out, "shape", ()))))
        for name, module in network.named_modules()
        if name
    ]
    try:
        with torch.no_grad():
            was_training = network.training
            network.eval()
            network(torch.zeros(1, 3, image_size, image_size, device=next(network.parameters()).device))
            network.train(was_training)
    finally:
        for hook in hooks:
            hook.remove()
    stages = getattr(network, "feature_info", None)
    if isinstance(stages, list) and stages and "module" in stages[-1]:
        name = stages[-1]["module"]
        shape = next((shape for finished_name, shape in finished if finished_name == name), None)
        if shape is None or len(shape) != 4:
            return None, f"the last stage of {type(backbone).__name__} ({name}) gives no spatial map (tokens)"
        return network.get_submodule(name), name
    maps = [i for i, (_, shape) in enumerate(finished) if len(shape) == 4 and shape[-1] * shape[-2] > 1]
    if not maps:
        return None, f"{type(backbone).__name__} has no convolutional stage to map"
    if any(len(shape) == 3 for _, shape in finished[maps[-1] + 1 :]):
        return None, f"{type(backbone).__name__} ends in tokens, not a spatial map (a transformer)"
    name = finished[maps[-1]][0]
    return network.get_submodule(name), name


def class_activation_maps(network: nn.Module, layer: nn.Module, images: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """Grad-CAM of ``classes`` for uint8 (N, 3, S, S) ``images``: (N, S, S) floats in [0, 1], 1 where it looked most.

    ``network`` takes the raw pixels (normalization inside), in evaluation mode. Runs with gradients on,
    also inside an evaluation loop's inference mode.
    """
    device = next(network.parameters()).device
    with torch.inference_mode(False), torch.enable_grad():
        pixels = torch.from_numpy(np.ascontiguousarray(images)).to(device=device, dtype=torch.float32)
        target = torch.as_tensor(classes, dtype=torch.int64, device=device)
        maps = LayerGradCam(network, layer).attribute(pixels, target=target, relu_attributions=True)
        maps = LayerAttribution.interpolate(maps.detach(), tuple(pixels.shape[-2:]), interpolate_mode="bilinear")
    maps = maps[:, 0].clamp_(min=0)
    peak = maps.flatten(1).amax(dim=1).clamp_(min=1e-12).view(-1, 1, 1)
    return (maps / peak).cpu().numpy()


def overlaid(images: np.ndarray, maps: np.ndarray, opacity: float = 0.45) -> np.ndarray:
    """uint8 (N, 3, S, S) images with their maps drawn over them (blue: nothing, red: most): (N, S, S, 3) uint8."""
    from matplotlib import colormaps

    heat = colormaps["jet"](maps)[..., :3] * 255  # (N, S, S, 3)
    blended = (1 - opacity) * images.transpose(0, 2, 3, 1).astype(np.float32) + opacity * heat
    return blended.round().clip(0, 255).astype(np.uint8)
