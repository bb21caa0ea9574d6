"""Augment whole uint8 batches on the device they already live on.

One random draw per batch instead of per-sample Python: the crop gathers shifted windows
from a padded batch (what ``RandomCrop(S, padding=p)`` does per image), the random-resized
crop (larger images) resamples one box per image in a single ``grid_sample``, and the flip
mirrors the selected images only. Draws come from a generator of our own, seeded from (run seed,
rank, epoch) at the start of every epoch, so a run is reproducible and a run resumed at an epoch
boundary draws what the uninterrupted run drew, without any generator state in the checkpoint. A
run resumed in the middle of an epoch first replays the draws of the batches it skips
(``resume_at``), on a one-channel stand-in batch: the draws depend on the batch size alone.

The alternating flip is airbench's derandomized flip: each image starts in a fixed pseudo-random
orientation and is mirrored on every odd epoch, so over any two epochs the network sees both
orientations of every image (airbench reports ~10% fewer steps to the same accuracy).

MixUp and CutMix (``mix``) are torchvision's, on the whole device batch: they turn the labels into
(N, classes) shares. Their few draws are CPU draws of torch's global generator, so each batch runs
them under a seed of its own taken from the epoch's stream (replayed on resume like the rest).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torchvision.transforms import v2

from ..foundation.errors import check_choice
from .image_files import centre_crop

FlipMode = Literal["random", "alternating", "none"]
PaddingMode = Literal["zeros", "reflect"]


@dataclass(frozen=True)
class AugmentSettings:
    """The ``data.*`` augmentation settings as given; None: chosen for the image size or the number of images."""

    crop_padding: int | None
    crop_padding_mode: PaddingMode
    random_resized_crop: bool | None
    resized_crop_scale: tuple[float, float]
    flip: FlipMode
    cutout: int
    mixup_alpha: float | None
    cutmix_alpha: float | None


def random_crop(
    images: Tensor, padding: int, generator: torch.Generator, padding_mode: PaddingMode = "zeros"
) -> Tensor:
    """Shift each image by up to ``padding`` pixels in each direction, filling with zeros or a reflection."""
    if padding <= 0:
        return images
    n, c, h, w = images.shape
    if padding_mode == "reflect" and padding >= min(h, w):
        raise ValueError(f"reflect padding must be smaller than the image, got {padding} for {h}x{w}")
    shifts = torch.randint(0, 2 * padding + 1, (2, n), device=images.device, generator=generator)
    # Each output pixel's source, in padded coordinates: row shift + i, column shift + j.
    rows = shifts[0, :, None] + torch.arange(h, device=images.device)
    cols = shifts[1, :, None] + torch.arange(w, device=images.device)
    if padding_mode == "reflect":  # read the reflected pixels straight from the batch
        source, source_width = images, w
        rows, cols = _reflect(rows - padding, h), _reflect(cols - padding, w)
    else:
        source, source_width = torch.nn.functional.pad(images, (padding, padding, padding, padding)), w + 2 * padding
    # One gather over the flattened image moves every window in a single pass over the batch.
    index = (rows[:, :, None] * source_width + cols[:, None, :]).view(n, 1, h * w).expand(n, c, h * w)
    return source.reshape(n, c, -1).gather(2, index).view(n, c, h, w)


def _reflect(index: Tensor, size: int) -> Tensor:
    """Map -k to k and size-1+k to size-1-k, as ``F.pad(mode="reflect")`` does."""
    return (size - 1) - ((size - 1) - index.abs()).abs()


def random_flip(images: Tensor, generator: torch.Generator) -> Tensor:
    """Mirror a random half of the images left to right."""
    return flip_where(images, torch.rand(images.shape[0], device=images.device, generator=generator) < 0.5)


def alternating_flip(images: Tensor, ids: Tensor, epoch: int, seed: int) -> Tensor:
    """Mirror image ``i`` when its fixed orientation bit differs from the epoch's parity."""
    # An LCG step of (id, seed): a stable, evenly split bit per image with no table to keep.
    offset = (seed * 1442695040888963407) % 2**64
    mixed = ids.to(torch.int64) * 6364136223846793005 + (offset - 2**64 if offset >= 2**63 else offset)
    start_flipped = (mixed >> 33) & 1
    return flip_where(images, start_flipped != epoch % 2)


def flip_where(images: Tensor, mask: Tensor) -> Tensor:
    """Mirror the images where ``mask`` is true: one pass over the batch (a masked copy makes three)."""
    return torch.where(mask.view(-1, *([1] * (images.dim() - 1))), images.flip(-1), images)


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


def random_resized_crop(
    images: Tensor, scale: tuple[float, float], generator: torch.Generator, size: int | None = None
) -> Tensor:
    """Cut a random box from each image (area share in ``scale``, aspect 3/4 to 4/3) and scale it to ``size``.

    What ``RandomResizedCrop`` does per image, for a whole batch in one ``grid_sample``: one bilinear
    sample per output pixel. ``size`` defaults to the images' own; packed images are at most an
    evaluation crop's margin (a few percent) larger than it, so a box is shrunk by little if at all and
    needs no antialiasing.
    """
    n, _, h, w = images.shape
    size = size or h
    device = images.device
    area = torch.empty(n, device=device).uniform_(scale[0], scale[1], generator=generator) * (h * w)
    log_ratio = torch.empty(n, device=device).uniform_(math.log(3 / 4), math.log(4 / 3), generator=generator)
    ratio = log_ratio.exp()
    box_w = (area * ratio).sqrt().clamp(1, w)
    box_h = (area / ratio).sqrt().clamp(1, h)
    left = torch.rand(n, device=device, generator=generator) * (w - box_w)
    top = torch.rand(n, device=device, generator=generator) * (h - box_h)
    # The affine map from output to input coordinates, both in [-1, 1] (align_corners=False).
    theta = torch.zeros(n, 2, 3, device=device)
    theta[:, 0, 0], theta[:, 0, 2] = box_w / w, (2 * left + box_w) / w - 1
    theta[:, 1, 1], theta[:, 1, 2] = box_h / h, (2 * top + box_h) / h - 1
    grid = F.affine_grid(theta, [n, 1, size, size], align_corners=False)
    crops = F.grid_sample(images.float(), grid, mode="bilinear", padding_mode="border", align_corners=False)
    return crops.round_().clamp_(0, 255).to(images.dtype) if not images.is_floating_point() else crops


MIX_STREAM = 0x5EED_0F_313C  # sets the mixing seeds' stream apart from the augmentation's


def batch_mixing(mixup_alpha: float, cutmix_alpha: float, num_classes: int | None) -> v2.Transform | None:
    """torchvision's MixUp and/or CutMix (one of the two per batch, at random, when both are on); None when off."""
    if mixup_alpha < 0 or cutmix_alpha < 0:
        raise ValueError(f"data.mixup_alpha and data.cutmix_alpha must be 0 or more, got {mixup_alpha}, {cutmix_alpha}")
    mixes = [
        mix(alpha=alpha, num_classes=num_classes)
        for mix, alpha in ((v2.MixUp, mixup_alpha), (v2.CutMix, cutmix_alpha))
        if alpha > 0
    ]
    if not mixes:
        return None
    return mixes[0] if len(mixes) == 1 else v2.RandomChoice(mixes)


def epoch_seed(seed: int, epoch: int) -> int:
    """A well-mixed 64-bit seed for (stream seed, epoch): neighbouring epochs get unrelated streams."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1, dtype=np.uint64)[0])


class BatchAugment:
    """The training-time augmentation policy, applied to a (N, 3, H, W) batch of any dtype."""

    def __init__(
        self,
        crop_padding: int = 4,
        flip: FlipMode = "random",
        cutout: int = 0,
        padding_mode: PaddingMode = "zeros",
        resized_crop_scale: tuple[float, float] | None = None,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        num_classes: int | None = None,
        output_size: int | None = None,
    ) -> None:
        check_choice("data.flip", flip, FlipMode)
        check_choice("data.crop_padding_mode", padding_mode, PaddingMode)
        self.crop_padding = crop_padding
        self.flip = flip
        self.cutout = cutout
        self.padding_mode = padding_mode
        self.resized_crop_scale = resized_crop_scale  # None: no random-resized crop
        self.output_size = output_size  # the network's input side, when the packed images are larger (a margin)
        self.mixup_alpha, self.cutmix_alpha = mixup_alpha, cutmix_alpha
        self.mixing = batch_mixing(mixup_alpha, cutmix_alpha, num_classes)  # None: labels stay class indices
        self.mix_generator = torch.Generator()  # the seeds of the batches' mixing draws, on the CPU
        self.generator: torch.Generator | None = None
        self._seed = 0
        self._image_seed = 0
        self._epoch: int | None = None
        self._resume: tuple[int, int] | None = None  # (epoch, batches already trained in it)

    def seed(self, seed: int, image_seed: int | None = None) -> None:
        """Set the stream seed; each epoch's draws come from a generator seeded with (seed, epoch).

        ``image_seed`` fixes each image's starting orientation for the alternating flip; it must be
        the same on every process (the stream seed differs per rank), so it defaults to ``seed``.
        """
        self._seed = seed
        self._image_seed = seed if image_seed is None else image_seed
        self.generator = None

    def resume_at(self, epoch: int, batches_done: int) -> None:
        """The next batch is batch ``batches_done`` of ``epoch``: draw past the ones before it first."""
        self._resume = (epoch, batches_done)

    def _generator_for(self, images: Tensor, epoch: int) -> torch.Generator:
        # Re-seeded at each epoch, like the sampler's order: a run resumed at an epoch boundary draws
        # exactly what it would have drawn, on every rank, with no generator state to checkpoint.
        if self.generator is None or self.generator.device != images.device or self._epoch != epoch:
            self.generator = torch.Generator(device=images.device).manual_seed(epoch_seed(self._seed, epoch))
            self.mix_generator.manual_seed(epoch_seed(self._seed, epoch) ^ MIX_STREAM)
            self._epoch = epoch
            skipped = self._resume[1] if self._resume is not None and self._resume[0] == epoch else 0
            stand_in = images.new_zeros((images.shape[0], 1, *images.shape[2:]))
            for _ in range(skipped):  # all batches of an epoch have one size (the last one is dropped)
                self._augment(stand_in, torch.zeros(len(stand_in), dtype=torch.int64), epoch, self.generator)
                self._mix_seed()
        self._resume = None
        return self.generator

    def __call__(self, images: Tensor, ids: Tensor | None = None, epoch: int = 0) -> Tensor:
        """Augment a batch; ``ids`` (each image's row in its split) and ``epoch`` drive the alternating flip."""
        return self._augment(images, ids, epoch, self._generator_for(images, epoch))

    def mix(self, images: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        """MixUp or CutMix the augmented batch: float images in [0, 255] and (N, classes) label shares.

        Class indices become one-hot shares; multi-label rows (N, classes) of 0/1 are mixed as they are.
        """
        if self.mixing is None:
            return images, labels
        if labels.dim() == 2:  # multi-label 0/1 rows: mixed as vectors, in the images' shares
            labels = labels.float()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self._mix_seed())
            return self.mixing(images.float(), labels)

    def _mix_seed(self) -> int:
        return int(torch.randint(0, 2**62, (1,), generator=self.mix_generator)) if self.mixing is not None else 0

    def _augment(self, images: Tensor, ids: Tensor | None, epoch: int, generator: torch.Generator) -> Tensor:
        if self.resized_crop_scale is not None:
            images = random_resized_crop(images, self.resized_crop_scale, generator, self.output_size)
        elif self.output_size is not None:
            images = centre_crop(images, self.output_size)
        images = random_crop(images, self.crop_padding, generator, self.padding_mode)
        if self.flip == "random":
            images = random_flip(images, generator)
        elif self.flip == "alternating":
            if ids is None:
                raise ValueError("the alternating flip needs each image's id; this batch has none")
            images = alternating_flip(images, ids, epoch, self._image_seed)
        return random_cutout(images, self.cutout, generator)
