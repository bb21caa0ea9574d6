"""The project's callbacks, each set under ``trainer.callbacks``: what it watches in training, and recipe parts.

The report and observability callbacks (``EvaluationReport``, ``ConfusionMatrix``, ``ImageThroughput``, ...)
come from ``classifier_engine.callbacks``.
"""

{% if cookiecutter.dataset == "images" -%}
from .freeze_backbone import FreezeBackbone
from .grad_scale_watchdog import GradScaleWatchdog
from .gradient_histograms import GradientHistograms
from .weight_averaging import EMAWeights

__all__ = ["EMAWeights", "FreezeBackbone", "GradScaleWatchdog", "GradientHistograms"]
{%- else -%}
from .grad_scale_watchdog import GradScaleWatchdog
from .gradient_histograms import GradientHistograms
from .lookahead import Lookahead
from .whitening import WhiteningFit

__all__ = ["GradScaleWatchdog", "GradientHistograms", "Lookahead", "WhiteningFit"]
{%- endif %}
