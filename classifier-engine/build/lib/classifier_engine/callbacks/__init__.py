"""Callbacks a config sets under ``trainer.callbacks`` to observe a run: reports, tables, throughput, predictions."""

from .confusion_matrix import ConfusionMatrix
from .evaluation_report import EvaluationReport
from .model_report import ModelReport
from .prediction_writer import PredictionWriter
from .sample_grid import SampleGrid
from .throughput import ImageThroughput

__all__ = ["ConfusionMatrix", "EvaluationReport", "ImageThroughput", "ModelReport", "PredictionWriter", "SampleGrid"]
