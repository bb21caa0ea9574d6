"""The project's callbacks, each set under ``trainer.callbacks``: what it watches in training, and recipe parts.

The report and observability callbacks (``EvaluationReport``, ``ConfusionMatrix``, ``ImageThroughput``, ...)
come from ``classifier_engine.callbacks``.
"""

from .freeze_backbone import FreezeBackbone
from .grad_scale_watchdog import GradScaleWatchdog
from .gradient_histograms import GradientHistograms
from .lookahead import Lookahead
from .weight_averaging import EMAWeights
from .whitening import WhiteningFit

__all__ = ["EMAWeights", "FreezeBackbone", "GradScaleWatchdog", "GradientHistograms", "Lookahead", "WhiteningFit"]
