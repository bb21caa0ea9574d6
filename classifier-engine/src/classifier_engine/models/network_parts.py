"""Parts every project's LightningModule builds its network from: the normalization and the penultimate features."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn
from typing_extensions import override


class Normalize(nn.Module):
    """uint8 (or [0, 255] float) images to standardized floats, inside the model.

    Keeping this in the model means the trained network, and anything exported from it, takes raw
    pixels: no deployment can forget or mis-copy the constants. ``mean`` and ``std`` are what the
    checkpoint's preprocessing record states.
    """

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        super().__init__()
        self.mean, self.std = tuple(float(v) for v in mean), tuple(float(v) for v in std)
        self.register_buffer("scale", 1.0 / (255.0 * torch.tensor(std).view(1, -1, 1, 1)))
        self.register_buffer("shift", torch.tensor(mean).view(1, -1, 1, 1) / torch.tensor(std).view(1, -1, 1, 1))

    @override
    def forward(self, images: Tensor) -> Tensor:
        return images.float() * self.scale - self.shift


def inference_batch(device: torch.device) -> int:
    """Images per forward pass where the library runs the network outside the loaders (features, scores).

    A CPU is fastest on small batches, whose activations stay in its caches (EfficientNet-Lite1 at 240 px
    evaluates about 2x faster in batches of 16 than of 64 on 2 cores); an accelerator wants large ones.
    """
    return 16 if device.type == "cpu" else 256


def head_input(head: nn.Module, run: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """What ``head`` receives while ``run(x)`` computes the logits: the penultimate features, flattened per image.

    Any network whose classifier head is a module (timm's ``get_classifier()``, a last ``nn.Linear``)
    answers the same way, so "unknown" scores and embeddings need nothing of each architecture.
    """
    seen: list[Tensor] = []
    hook = head.register_forward_pre_hook(lambda _module, args: seen.append(args[0]))
    try:
        run(x)
    finally:
        hook.remove()
    if not seen:
        raise ValueError(f"the classifier head ({type(head).__name__}) was not called by the network's forward")
    return seen[-1].flatten(1)


def logits_and_features(head: nn.Module, run: Callable[[], Tensor]) -> tuple[Tensor, Tensor]:
    """``run()``'s logits and, from the same forward passes, the features ``head`` received (averaged over the
    views when ``run`` evaluates several): "unknown" scores at predict cost no second pass through the network."""
    seen: list[Tensor] = []
    hook = head.register_forward_pre_hook(lambda _module, args: seen.append(args[0].flatten(1)))
    try:
        logits = run()
    finally:
        hook.remove()
    if not seen:
        raise ValueError(f"the classifier head ({type(head).__name__}) was not called by the network's forward")
    return logits, torch.stack(seen).mean(0) if len(seen) > 1 else seen[0]


class SharedRecipe:
    """An optimizer or schedule recipe that a copy of the model shares instead of copying.

    A config's recipes are jsonargparse callables holding its parser's lock, which cannot be copied
    (weight averaging copies the whole model); they are never changed, so sharing them is safe.
    """

    def __init__(self, recipe: Callable) -> None:
        self.recipe = recipe

    def __call__(self, *args, **kwargs):
        return self.recipe(*args, **kwargs)

    def __deepcopy__(self, memo: dict[int, object]) -> SharedRecipe:
        return self


class ScheduleRecipe(SharedRecipe):
    """A learning-rate schedule recipe (``(optimizer, total_steps) -> scheduler``), tried once when it is given.

    The schedule is built only when training starts; trying it against a stand-in optimizer here makes a bad
    option (a warm-up share of 2, a misspelt argument) fail when the model is built, before data is packed or a
    run folder is made.
    """

    def __init__(self, recipe: Callable) -> None:
        super().__init__(recipe)
        recipe(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0), 100)
