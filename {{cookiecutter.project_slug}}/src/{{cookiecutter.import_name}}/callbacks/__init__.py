"""Callbacks, each set under ``trainer.callbacks``: what makes training observable, and recipe parts."""

from .confusion_matrix import ConfusionMatrix
from .evaluation_report import EvaluationReport
from .freeze_backbone import FreezeBackbone
from .grad_scale_watchdog import GradScaleWatchdog
from .gradient_histograms import GradientHistograms
from .lookahead import Lookahead
from .model_report import ModelReport
from .prediction_writer import PredictionWriter
from .sample_grid import SampleGrid
from .throughput import ImageThroughput
from .weight_averaging import EMAWeights
from .whitening import WhiteningFit

__all__ = [
    "ConfusionMatrix",
    "EMAWeights",
    "EvaluationReport",
    "FreezeBackbone",
    "GradScaleWatchdog",
    "GradientHistograms",
    "ImageThroughput",
    "Lookahead",
    "ModelReport",
    "PredictionWriter",
    "SampleGrid",
    "WhiteningFit",
]
