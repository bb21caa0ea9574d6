"""One image file (or array) to the network's input: 8-bit RGB, S x S, by one resize rule.

Packing, ``predict`` on a folder and anything a deployment writes use this module, so the
pixels a model is trained on and the pixels it is asked about are made the same way.

- EXIF orientation is applied first (phone photos are stored rotated).
- Every mode becomes 8-bit RGB: grayscale and palette are expanded; 16-bit and 32-bit integer
  images are scaled to 8 bits (not clipped); CMYK is converted; transparency (RGBA, LA, a palette
  with a transparent colour) is flattened onto white. Multi-frame files (GIF, TIFF) give their
  first frame.
- ``resize``: ``crop`` scales the shorter side to S and cuts the centre square (nothing is
  distorted; the borders of the longer side are lost); ``pad`` scales the longer side to S and
  pads the rest with black (nothing is lost); ``stretch`` scales each side to S.
- A JPEG larger than needed is decoded at 1/2, 1/4 or 1/8 scale (``Image.draft``): the same
  pixels after the final (antialiased) resize, several times faster for photos.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

import numpy as np
from PIL import Image, ImageOps

if TYPE_CHECKING:  # decoding needs no torch: a server runs this without it (the Dockerfile's serve stage)
    from torch import Tensor

Resize = Literal["crop", "pad", "stretch"]
Interpolation = Literal["bilinear", "bicubic"]  # what pretrained weights were trained with (timm's pretrained_cfg)
T = TypeVar("T", np.ndarray, "Tensor")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
FLATTEN_ONTO = (255, 255, 255)  # the background transparent pixels are flattened onto
# Antialiased when shrinking (PIL filters over the whole footprint).
RESAMPLING = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}


class BadImageError(Exception):
    """A file that cannot be read as an image; the message says why in a few words."""


def is_image_file(path: Path) -> bool:
    """An image by its extension (any case), not hidden (``.DS_Store``, ``._photo.jpg`` of macOS)."""
    return path.suffix.lower() in IMAGE_SUFFIXES and not path.name.startswith(".")


def to_rgb(image: Image.Image) -> Image.Image:
    """Any PIL mode as 8-bit RGB (see the module's docstring for each mode)."""
    if image.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        pixels = np.asarray(image, dtype=np.float64)
        top = 65535.0 if pixels.max(initial=0) > 255 or image.mode.startswith("I;16") else 255.0
        image = Image.fromarray(np.clip(pixels * (255.0 / top) + 0.5, 0, 255).astype(np.uint8), "L")
    elif image.mode == "F":
        pixels = np.asarray(image, dtype=np.float64)
        top = 1.0 if pixels.max(initial=0) <= 1.0 else 255.0
        image = Image.fromarray(np.clip(pixels * (255.0 / top) + 0.5, 0, 255).astype(np.uint8), "L")
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (*FLATTEN_ONTO, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB") if image.mode != "RGB" else image


def packed_side(size: int, resize: Resize, crop_pct: float) -> int:
    """The side an image is packed at: ``size / crop_pct`` for the crop rule (the evaluation resize before its crop).

    Evaluation takes the centre ``size`` x ``size`` of it (``centre_crop``), the random-resized crop of
    training a box anywhere in it: the margin an evaluation crop leaves out is still there to train on.
    """
    return max(size, round(size / crop_pct)) if resize == "crop" else size


def centre_crop(images: T, size: int) -> T:
    """The centre ``size`` x ``size`` of the last two dimensions (arrays and tensors alike; as it is when no larger)."""
    height, width = images.shape[-2:]
    top, left = (height - size) // 2, (width - size) // 2
    return images[..., top : top + size, left : left + size]


def fit_to_square(
    image: Image.Image,
    size: int,
    resize: Resize = "crop",
    interpolation: Interpolation = "bilinear",
    crop_pct: float = 1.0,
) -> Image.Image:
    """An RGB image as ``size`` x ``size`` by the rule ``resize`` (crop, pad or stretch).

    ``crop_pct`` < 1 (crop only) is the evaluation resize pretrained weights expect: the centre square
    at ``size / crop_pct`` (``packed_side``), then its centre ``size`` x ``size``, as packed images are served.
    """
    method = RESAMPLING[interpolation]
    if resize == "crop":
        side = packed_side(size, resize, crop_pct)
        square = ImageOps.fit(image, (side, side), method=method)
        if side == size:
            return square
        offset = (side - size) // 2  # centre_crop's offset, so a packed image served cropped is this image
        return square.crop((offset, offset, offset + size, offset + size))
    if resize == "pad":
        return ImageOps.pad(image, (size, size), method=method, color=(0, 0, 0))
    if resize == "stretch":
        return image.resize((size, size), method)
    raise ValueError(f"resize must be crop, pad or stretch, got {resize!r}")


def decode_image(
    path: Path | bytes,
    size: int,
    resize: Resize = "crop",
    interpolation: Interpolation = "bilinear",
    crop_pct: float = 1.0,
) -> np.ndarray:
    """The file at ``path`` (or a file's bytes, as a server receives them) as uint8 (size, size, 3); raises
    ``BadImageError`` when it is not a readable image."""
    try:
        if (len(path) if isinstance(path, bytes) else path.stat().st_size) == 0:
            raise BadImageError("empty file")
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)  # a bomb is a bad image, not a warning
            source = io.BytesIO(path) if isinstance(path, bytes) else path
            with Image.open(source) as image:
                if image.format == "JPEG" and resize != "pad":
                    # Shrinks by a power of two while decoding, never below size x size.
                    image.draft("RGB", (round(size / crop_pct), round(size / crop_pct)))
                elif image.format == "JPEG":
                    longer = max(image.size)
                    image.draft("RGB", (image.size[0] * size // longer, image.size[1] * size // longer))
                image.load()  # PIL reads lazily: a truncated file fails here, not in open()
                upright = ImageOps.exif_transpose(image)
                square = fit_to_square(to_rgb(upright), size, resize, interpolation, crop_pct)
                pixels = np.asarray(square, dtype=np.uint8)
    except BadImageError:
        raise
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        # UnidentifiedImageError and "image file is truncated" are OSErrors; PIL's plugins raise the others.
        said = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise BadImageError(said.replace(f" {source}", "") if isinstance(path, bytes) else said) from error
    return pixels


def resize_array(
    pixels: np.ndarray,
    size: int,
    resize: Resize = "crop",
    interpolation: Interpolation = "bilinear",
    crop_pct: float = 1.0,
) -> np.ndarray:
    """An (H, W, 3) uint8 image as (size, size, 3) by the same rule as files."""
    if pixels.shape[:2] == (size, size) and crop_pct == 1:
        return pixels
    square = fit_to_square(Image.fromarray(pixels, "RGB"), size, resize, interpolation, crop_pct)
    return np.asarray(square, dtype=np.uint8)
