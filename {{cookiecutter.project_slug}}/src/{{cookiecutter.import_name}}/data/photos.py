"""Your photos: class folders (or split folders, a CSV list, arrays), packed once into memory maps.

Change here how a new run splits the photos and how training batches are augmented: packed, or streamed
from a store ``pack.py`` wrote through this class (``data.source``), alike. Packing and its cache, streaming,
the loaders, the held-out rows a checkpoint records and exact resume are classifier_engine's
``ImageFolderDataModule``, whose ``data.*`` settings this class takes as they are.
"""

from __future__ import annotations

import numpy as np
from typing_extensions import override

from classifier_engine import RESIZED_CROP_FROM, BatchAugment, ImageFolderDataModule, stratified_split


class PhotoDataModule(ImageFolderDataModule):
    """Batches of your photos as uint8 (N, 3, image_size, image_size) tensors, augmented on the device."""

    @override
    def split(self, labels: np.ndarray, fractions: tuple[float, float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each class's photos held out in the (val, test) shares, drawn with ``data.split_seed``.

        Split otherwise here, e.g. by photographer or by date, so that near-duplicates never straddle
        training and validation.
        """
        return stratified_split(labels, fractions, self.split_seed)

    @override
    def sized_augmentation(self) -> BatchAugment:
        """A random part of each photo (``data.resized_crop_scale`` of its area) at full size, and a mirror.

        Below 64 px (``RESIZED_CROP_FROM``), unless ``data.random_resized_crop`` says otherwise, a shifted crop
        padded by an eighth of the side replaces the resized crop, as small images are trained.

        MixUp and CutMix, unless ``data.mixup_alpha``/``data.cutmix_alpha`` are set, follow the number of
        training photos (on from 20,000, the engine's choice).
        """
        given = self.augment_settings
        mixup = given.mixup_alpha if given.mixup_alpha is not None else self.chosen.get("mixup_alpha", 0.0)
        cutmix = given.cutmix_alpha if given.cutmix_alpha is not None else self.chosen.get("cutmix_alpha", 0.0)
        resized = given.random_resized_crop
        if resized is None:
            resized = self.image_size >= RESIZED_CROP_FROM
        padding = (
            given.crop_padding if given.crop_padding is not None else (0 if resized else max(1, self.image_size // 8))
        )
        return BatchAugment(
            crop_padding=padding,
            flip=given.flip,
            cutout=given.cutout,
            padding_mode=given.crop_padding_mode,
            resized_crop_scale=given.resized_crop_scale if resized else None,
            mixup_alpha=mixup,
            cutmix_alpha=cutmix,
            num_classes=self.num_classes,
            output_size=self.image_size,
        )
