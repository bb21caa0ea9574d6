"""How an image becomes the network's input, as one record the trained model keeps (as timm's ``pretrained_cfg``).

The DataModule that trained the model states it (``ImageDataModule.preprocessing``), every checkpoint carries
it under ``"preprocessing"``, and whatever later reads the model takes it from there: ``validate``, ``test``
and ``predict`` make their images by it, ``export.py`` writes it into the model card, and an application
that loads the exported file resizes and normalizes by it. A checkpoint written before the record existed
(classifier-engine 1.0) gives the same values from the DataModule's and the model's saved settings.
"""

from __future__ import annotations

import typing
from dataclasses import asdict, dataclass, fields
from typing import Any

from ..foundation.plain_values import admits
from .errors import DataSettingError
from .image_files import Interpolation, Resize

# ImageNet's statistics: close to those of most photo collections, and what pretrained weights expect.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

CHECKPOINT_KEY = "preprocessing"
MAX_IMAGE_SIZE = 8192  # the largest side a record may state: a bound on what a file can make a command allocate
RESIZE_RULES = {
    "crop": "shorter side scaled to {scaled} px ({interpolation}, antialiased), then the centre {size}x{size} square",
    "pad": "longer side scaled to {size} px ({interpolation}, antialiased), then padded with black to {size}x{size}",
    "stretch": "each side scaled to {size} px ({interpolation}, antialiased)",
}


@dataclass(frozen=True)
class Preprocessing:
    """Side, resize rule, interpolation, crop share, and the normalization inside the network."""

    image_size: int
    resize: Resize
    interpolation: Interpolation
    crop_pct: float
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "mean": list(self.mean), "std": list(self.std)}

    @classmethod
    def from_dict(cls, values: Any) -> Preprocessing:
        """The record from plain data of a file (a checkpoint, a card), each value checked against its field's type.

        Raises ``DataSettingError`` naming the field that is missing, not plain data of its type, or out of range.
        """
        if not isinstance(values, dict):
            raise DataSettingError("the preprocessing record is not a set of values")
        hints = typing.get_type_hints(cls)
        for field in fields(cls):
            value = values.get(field.name)
            if not admits(hints[field.name], value, "literals"):
                raise DataSettingError(f"the preprocessing record's {field.name} is not a {hints[field.name]}")
        if not 1 <= values["image_size"] <= MAX_IMAGE_SIZE or not 0 < values["crop_pct"] <= 1:
            raise DataSettingError("the preprocessing record's image_size or crop_pct is out of range")
        known = {field.name: values[field.name] for field in fields(cls)}
        return cls(**{**known, "mean": tuple(known["mean"]), "std": tuple(known["std"])})

    @classmethod
    def of_checkpoint(cls, checkpoint: dict[str, Any]) -> Preprocessing | None:
        """The checkpoint's record; for a checkpoint written before it existed, the same from its saved settings.

        None when neither says it (a checkpoint not written by ``main.py fit``).
        """
        if CHECKPOINT_KEY in checkpoint:
            return cls.from_dict(checkpoint[CHECKPOINT_KEY])
        data, model = checkpoint.get("datamodule_hyper_parameters", {}), checkpoint.get("hyper_parameters", {})
        size = model.get("image_size") or data.get("image_size")
        if size is None or model.get("mean") is None or model.get("std") is None:
            return None
        return cls.from_dict(
            {
                "image_size": size,
                # 1.0's CIFAR DataModule did not save its rule (stretch: CIFAR's images were made so); the others did.
                "resize": data.get("resize") or ("stretch" if "dataset" in data else "crop"),
                "interpolation": data.get("interpolation") or "bilinear",
                "crop_pct": data.get("crop_pct") or 1.0,
                "mean": model["mean"],
                "std": model["std"],
            }
        )

    def resize_rule(self) -> str:
        """In words: how an image of any size became the network's input (PIL, after EXIF rotation, as RGB)."""
        size, share = self.image_size, self.crop_pct
        scaled = f"{size}" if share == 1 else f"{round(size / share)} ({size} / crop share {share})"
        rule = RESIZE_RULES.get(self.resize, self.resize)
        return rule.format(size=size, scaled=scaled, interpolation=self.interpolation)
