"""The contract every exported file keeps, and the sample inputs that trace and check it.

Every artifact takes what a deployment has: uint8 RGB images, NCHW, shape (batch, 3, S, S)
(S: the image size the model was trained at),
pixel values 0-255, with the normalization inside; it returns float32 logits (batch, classes) and, where the model
fitted one, the "unknown" score (batch,) as a second output, ``score``.
"""

from __future__ import annotations

from typing import Any

import torch

INPUT_NAME, OUTPUT_NAME, SCORE_NAME = "images", "logits", "score"
MAX_BATCH = 4096


def dynamic_batch() -> tuple[dict[int, torch.export.Dim]]:
    """The one dynamic dimension of every exported graph: the batch of its one input (whatever forward() calls it)."""
    return ({0: torch.export.Dim("batch", min=1, max=MAX_BATCH)},)


def sample_images(batch: int, seed: int = 0, size: int = 32) -> torch.Tensor:
    """Deterministic, natural-looking uint8 images (batch, 3, size, size): smooth colour fields plus a little noise."""
    generator = torch.Generator().manual_seed(seed)
    coarse = torch.rand(batch, 3, 4, 4, generator=generator) * 255
    smooth = torch.nn.functional.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)
    noise = torch.randn(batch, 3, size, size, generator=generator) * 8
    return (smooth + noise).clamp(0, 255).to(torch.uint8)


# The one-view test-time augmentation every project's models/test_time.py starts from.
ONE_VIEW = "TestTimeAugmentation"


class Views(torch.nn.Module):
    """The backbone under the run's test-time augmentation: each image's views averaged, as ``evaluate`` does."""

    def __init__(self, backbone: torch.nn.Module, views: Any) -> None:
        super().__init__()
        self.backbone, self.views = backbone, views

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.views(self.backbone, x)


def views_of(model: Any) -> str | None:
    """The name of the test-time augmentation the exported files compute (None: one view per image)."""
    views = getattr(model, "test_time_augmentation", None)
    network = model.network()
    if views is None or type(views).__name__ == ONE_VIEW or not isinstance(network, torch.nn.Sequential):
        return None
    return type(views).__name__ if any(part is model.backbone for part in network) else None


def exported_network(model: Any) -> torch.nn.Module:
    """``model.network()`` with the run's test-time views inside, so a file answers as ``predict`` does.

    ``network()`` is normalization, the backbone and the temperature; the views wrap the backbone, on normalized
    images, exactly as ``evaluate`` applies them. A ``network()`` of another shape is exported as it is, one view
    (the card then says that the run's own evaluation averages views the files do not).
    """
    network = model.network()
    if views_of(model) is None:
        return network
    return torch.nn.Sequential(
        *(Views(part, model.test_time_augmentation) if part is model.backbone else part for part in network)
    )


def inference_module(model: Any) -> torch.nn.Module:
    """What every exported file computes: ``network()``'s calibrated logits, and beside them, as a second output
    named ``score``, the "unknown" score of ``model.reject_with`` where the calibration has fitted one."""
    from ..models.domain import ScoredNetwork, find_head

    own = getattr(model, "inference_module", None)
    if callable(own):  # a model that combines others' scores (a fold ensemble) says what it computes
        return own()
    network, calibration = exported_network(model), model.calibration
    fitted = calibration.reject_with in calibration.by_score
    if not fitted or (calibration.reject_with == "knn" and not len(calibration.bank)):
        return network
    head = find_head(model, sample_images(2, size=model.image_size).to(calibration.temperature.device))
    return ScoredNetwork(network, head, calibration)


def output_names(module: torch.nn.Module) -> list[str]:
    from ..models.domain import ScoredNetwork

    if getattr(module, "output_names", None):
        return list(module.output_names)
    return [OUTPUT_NAME, SCORE_NAME] if isinstance(module, ScoredNetwork) else [OUTPUT_NAME]
