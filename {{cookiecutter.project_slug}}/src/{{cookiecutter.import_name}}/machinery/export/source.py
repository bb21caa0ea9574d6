"""The model to ship, rebuilt from a checkpoint, and the contract every exported file keeps.

Every artifact takes what a deployment has: uint8 RGB images, NCHW, shape (batch, 3, 32, 32),
pixel values 0-255, with the normalization inside; it returns float32 logits (batch, classes).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...models import ImageClassifier
from ..checkpoint_io import CheckpointError, read_checkpoint
from ..errors import UsageError, UserError, parse_error_line

INPUT_NAME, OUTPUT_NAME = "images", "logits"
MAX_BATCH = 4096


class ExportError(UsageError):
    """The export cannot proceed as asked; the message says what is wrong and how to fix it."""


class ExportCheckError(UserError):
    """An artifact failed a check (parity, accuracy); the message says by how much and what to try."""


def dynamic_batch() -> dict[str, dict[int, torch.export.Dim]]:
    """The one dynamic dimension of every exported graph, keyed by the forward() argument's name."""
    return {"images": {0: torch.export.Dim("batch", min=1, max=MAX_BATCH)}}


def load_model(ckpt_path: Path) -> tuple[ImageClassifier, dict]:
    """The model rebuilt from the checkpoint's hyperparameters, in eval mode, and the raw checkpoint."""
    if not ckpt_path.is_file():
        problem = "is a folder" if ckpt_path.is_dir() else "does not exist"
        raise ExportError(f"checkpoint {ckpt_path} {problem}; pass the path of a .ckpt file with --ckpt_path")
    try:
        checkpoint = read_checkpoint(ckpt_path)
    except CheckpointError as error:
        raise ExportError(str(error)) from error
    try:
        model = ImageClassifier.load_from_checkpoint(ckpt_path, map_location="cpu")
    except Exception as error:  # a checkpoint of another model fails in many ways
        # One line; e.g. "model.backbone: No module named 'my_nets'" for a network that is not importable here.
        reason = parse_error_line(str(error)).replace("module.", "model.", 1)
        raise ExportError(f"{ckpt_path} does not rebuild an ImageClassifier: {reason}") from error
    return model.eval(), checkpoint


def sample_images(batch: int, seed: int = 0) -> torch.Tensor:
    """Deterministic, natural-looking uint8 images: smooth colour fields plus a little noise."""
    generator = torch.Generator().manual_seed(seed)
    coarse = torch.rand(batch, 3, 4, 4, generator=generator) * 255
    smooth = torch.nn.functional.interpolate(coarse, size=(32, 32), mode="bilinear", align_corners=False)
    noise = torch.randn(batch, 3, 32, 32, generator=generator) * 8
    return (smooth + noise).clamp(0, 255).to(torch.uint8)
