"""The CIFAR render's model with its steps rewritten as a user would: plain cross-entropy, nothing of the engine."""

from __future__ import annotations

import sys
from pathlib import Path

import torch.nn.functional as F
from cifar_classifier.models import ImageClassifier


class PlainSteps(ImageClassifier):
    """``training_step`` returns a bare loss; ``validation_step`` logs two numbers and returns nothing."""

    def training_step(self, batch, batch_idx):
        images, labels = batch
        return F.cross_entropy(self(images), labels)

    def validation_step(self, batch, batch_idx):
        images, labels = batch
        logits = self(images)
        self.log("val/loss", F.cross_entropy(logits, labels))
        self.log("val/top1", (logits.argmax(dim=1) == labels).float().mean())


class NoFeatures(ImageClassifier):
    """A model that dropped a method of the contract."""

    features = None


if __name__ == "__main__":  # python rewritten_model.py {main,export} CLASS ARGS...: that command on CLASS
    from classifier_engine import run_export, run_main

    command, model = sys.argv[1], globals()[sys.argv[2]]
    del sys.argv[1:3]
    config = Path(sys.modules["cifar_classifier"].__file__).parents[2] / "configs" / "cifar10.yaml"
    (run_main if command == "main" else run_export)(model, config)
