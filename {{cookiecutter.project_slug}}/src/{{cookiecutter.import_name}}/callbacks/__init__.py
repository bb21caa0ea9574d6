"""Callbacks that make training observable, and the fast recipe's lookahead; each is set under ``trainer.callbacks``."""

from .confusion_matrix import ConfusionMatrix
from .grad_scale_watchdog import GradScaleWatchdog
from .gradient_histograms import GradientHistograms
from .lookahead import Lookahead
from .model_report import ModelReport
from .prediction_writer import PredictionWriter
from .random_state import RandomState
from .sample_grid import SampleGrid
from .throughput import ImageThroughput

__all__ = [
    "ConfusionMatrix",
    "GradScaleWatchdog",
    "GradientHistograms",
    "ImageThroughput",
    "Lookahead",
    "ModelReport",
    "PredictionWriter",
    "RandomState",
    "SampleGrid",
]
