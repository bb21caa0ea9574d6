"""Your own images for ``predict``: every PNG/JPEG (or other common format) in a folder, as 32x32 RGB uint8."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_only
from PIL import Image
from torch import Tensor

from .errors import DataSettingError

log = logging.getLogger(__name__)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


def load_image_folder(folder: Path, size: int = 32) -> tuple[Tensor, list[str]]:
    """Images (N, 3, size, size) uint8 and their paths relative to ``folder``, in sorted order.

    Any mode (grayscale, palette, RGBA, CMYK) becomes RGB and any size is resized (bilinear)
    to ``size`` x ``size``, as the network expects. A file that cannot be read as an image is
    skipped with a one-line warning naming it, so one bad file never stops the others.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise DataSettingError(f"data.predict_dir={folder} is not a folder; point it at a folder of PNG/JPEG images")
    images, names = [], []
    for path in sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES):
        try:
            with Image.open(path) as image:
                pixels = np.asarray(image.convert("RGB").resize((size, size), Image.Resampling.BILINEAR))
        except (OSError, ValueError, Image.DecompressionBombError) as error:  # UnidentifiedImageError is an OSError
            if rank_zero_only.rank == 0:
                log.warning("skipped %s: not a readable image (%s)", path, str(error).splitlines()[0])
            continue
        images.append(pixels.transpose(2, 0, 1))
        names.append(str(path.relative_to(folder)))
    if not images:
        raise DataSettingError(
            f"data.predict_dir={folder} holds no readable image ({', '.join(IMAGE_SUFFIXES)}); "
            "point it at a folder of images"
        )
    return torch.from_numpy(np.ascontiguousarray(np.stack(images))), names
