"""The model: the LightningModule, and the parts a config plugs into it (backbones, schedules, test-time views)."""

from .classifier import ImageClassifier

__all__ = ["ImageClassifier"]
