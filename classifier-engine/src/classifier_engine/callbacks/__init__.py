"""Callbacks a config sets under ``trainer.callbacks``: reports, tables, throughput, predictions; the linear probe."""

from .confusion_matrix import ConfusionMatrix
from .evaluation_report import EvaluationReport
from .linear_probe import LinearProbe
from .model_report import ModelReport
from .prediction_writer import PredictionWriter
from .sample_grid import SampleGrid
from .throughput import ImageThroughput

__all__ = [
    "ConfusionMatrix",
    "EvaluationReport",
    "ImageThroughput",
    "LinearProbe",
    "ModelReport",
    "PredictionWriter",
    "SampleGrid",
]
