"""The model: backbones built by name, and the LightningModule that trains them."""

from .classifier import ImageClassifier

__all__ = ["ImageClassifier"]
