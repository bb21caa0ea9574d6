"""Augment whole uint8 batches on the device they already live on.

One random draw per batch instead of per-sample Python: the crop gathers shifted windows
from a zero-padded batch (what ``RandomCrop(32, padding=p)`` does per image) and the flip
mirrors the selected images only. Draws come from a generator of our own, seeded explicitly, so
a run is reproducible and the generator's state can be checkpointed.
"""

from __future__ import annotations

import torch
from torch import Tensor


def random_crop(images: Tensor, padding: int, generator: torch.Generator) -> Tensor:
    """Shift each image by up to ``padding`` pixels in each direction, filling with zeros."""
    if padding <= 0:
        return images
    n, c, h, w = images.shape
    padded = torch.nn.functional.pad(images, (padding, padding, padding, padding))
    shifts = torch.randint(0, 2 * padding + 1, (2, n), device=images.device, generator=generator)
    # Two gathers (rows, then columns) move each image's window in one pass over the batch.
    rows = shifts[0, :, None] + torch.arange(h, device=images.device)
    band = padded.gather(2, rows[:, None, :, None].expand(n, c, h, w + 2 * padding))
    cols = shifts[1, :, None] + torch.arange(w, device=images.device)
    return band.gather(3, cols[:, None, None, :].expand(n, c, h, w))


def random_flip(images: Tensor, generator: torch.Generator) -> Tensor:
    """Mirror a random half of the images left to right."""
    flip = torch.rand(images.shape[0], device=images.device, generator=generator) < 0.5
    flipped = images.clone()
    flipped[flip] = images[flip].flip(-1)
    return flipped


def random_cutout(images: Tensor, size: int, generator: torch.Generator) -> Tensor:
    """Zero one ``size`` x ``size`` square per image, centred anywhere (clipped at the borders)."""
    if size <= 0:
        return images
    n, _, h, w = images.shape
    centres = torch.randint(0, h * w, (n,), device=images.device, generator=generator)
    rows = torch.arange(h, device=images.device)[None, :, None] - (centres // w)[:, None, None]
    cols = torch.arange(w, device=images.device)[None, None, :] - (centres % w)[:, None, None]
    half = size // 2
    inside = (rows >= -half) & (rows < size - half) & (cols >= -half) & (cols < size - half)
    return images.masked_fill(inside[:, None], 0)


class BatchAugment:
    """The training-time augmentation policy, applied to a (N, 3, H, W) batch of any dtype."""

    def __init__(self, crop_padding: int = 4, flip: bool = True, cutout: int = 0) -> None:
        self.crop_padding = crop_padding
        self.flip = flip
        self.cutout = cutout
        self.generator: torch.Generator | None = None
        self._seed = 0
        self._restored: torch.Tensor | None = None

    def seed(self, seed: int) -> None:
        """Restart the random stream; the generator is made on the first batch's device."""
        self._seed = seed
        self._restored = None
        self.generator = None

    def state(self) -> torch.Tensor | None:
        """The generator's state, to checkpoint (None before the first batch)."""
        return self.generator.get_state() if self.generator is not None else self._restored

    def set_state(self, state: torch.Tensor | None) -> None:
        """Continue a checkpointed stream: applied when the generator is made on the batch's device."""
        self._restored = state
        self.generator = None

    def _generator_for(self, device: torch.device) -> torch.Generator:
        if self.generator is None or self.generator.device != device:
            self.generator = torch.Generator(device=device).manual_seed(self._seed)
            if self._restored is not None:
                self.generator.set_state(self._restored)
        return self.generator

    def __call__(self, images: Tensor) -> Tensor:
        generator = self._generator_for(images.device)
        images = random_crop(images, self.crop_padding, generator)
        if self.flip:
            images = random_flip(images, generator)
        return random_cutout(images, self.cutout, generator)
