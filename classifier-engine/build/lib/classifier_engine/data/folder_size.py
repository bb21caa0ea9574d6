"""Settings of a fine-tune that follow how many training images there are, where the config leaves them null.

A few hundred photos and a few hundred thousand want different recipes. A batch of 64 on 245
photos is 3 optimizer steps an epoch; MixUp blurs the few examples a small folder has (BiT turns
it off below 20,000 images). The data module applies these rules when it first sees its training
split, and the fit's first line says what they chose (``callbacks/freeze_backbone.py``).
"""

from __future__ import annotations

# (fewer than this many training images, batch): small folders get small batches, so an epoch has
# about 15 optimizer steps or more; from 10,000 images on, 64.
BATCH_BY_IMAGES = ((1_000, 16), (10_000, 32))
LARGE_BATCH = 64
MIXUP_FROM_IMAGES = 20_000  # BiT's threshold: below it, MixUp costs more accuracy than it gains
MIXUP_ALPHA = 0.2
CUTMIX_ALPHA = 1.0
HEAD_FIRST_BELOW_IMAGES = 100_000


def batch_for(images: int) -> int:
    """The training images per optimizer step for ``images`` training images (shared by the devices)."""
    return next((batch for below, batch in BATCH_BY_IMAGES if images < below), LARGE_BATCH)


def mixup_for(images: int) -> float:
    """MixUp's alpha for ``images`` training images: on from ``MIXUP_FROM_IMAGES``, off (0) below."""
    return MIXUP_ALPHA if images >= MIXUP_FROM_IMAGES else 0.0


def cutmix_for(images: int) -> float:
    """CutMix's alpha for ``images`` training images: on from ``MIXUP_FROM_IMAGES``, off (0) below."""
    return CUTMIX_ALPHA if images >= MIXUP_FROM_IMAGES else 0.0


def head_epochs_for(images: int) -> int:
    """Epochs the new head trains alone before every layer does: one below ``HEAD_FIRST_BELOW_IMAGES``, else none.

    A linear probe first keeps a small folder's few, large early gradients off the pretrained body
    (LP-FT, Kumar et al. 2022); on a large folder one epoch of it is long and the body is not at risk.
    """
    return 1 if images < HEAD_FIRST_BELOW_IMAGES else 0


def counted(number: int, noun: str) -> str:
    """``3 steps``, ``1 step``: a count in the plan's words."""
    return f"{number:,} {noun}{'' if number == 1 else 's'}"
