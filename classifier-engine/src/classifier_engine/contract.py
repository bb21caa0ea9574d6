"""What the engine asks of a project's LightningModule, stated once as a ``typing.Protocol``.

The CLI links the data's settings into the model by the names ``LinkedFromData`` declares, checks a
model class against ``ClassifierModel`` before anything is built (naming, in one line, what is
missing), and export, the reports and the guarantee callbacks read a model through these names only.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from torch import Tensor, nn

from .foundation.errors import UsageError
from .models.calibration import Calibration
from .models.network_parts import Normalize


class LinkedFromData(Protocol):
    """The settings the data knows and the model takes as constructor arguments of the same names.

    The CLI links each one the model's constructor accepts (``num_classes`` at least), so a config
    never states them twice.
    """

    num_classes: int  # how many classes
    class_names: list[str] | None  # their names, stored in checkpoints
    mean: tuple[float, float, float]  # per-channel mean of the data in [0, 1]
    std: tuple[float, float, float]  # per-channel standard deviation in [0, 1]
    image_size: int  # side in pixels of the square images
    class_counts: list[int] | None  # training images per class, when the data knows them
    task: str  # multiclass or multilabel
    images_counted: int | None  # training images class_counts counts


LINKED_FROM_DATA: tuple[str, ...] = tuple(LinkedFromData.__annotations__)


@runtime_checkable
class ResumableSchedule(Protocol):
    """A learning-rate schedule that can be put at a step (a checkpoint without its state still resumes it)."""

    last_epoch: int

    def resume_at(self, step: int) -> None:
        """Put the configured hyperparameters back and move the schedule to ``step``."""
        ...


@runtime_checkable
class ClassifierModel(Protocol):
    """A project's LightningModule as the engine uses it: uint8 images in, logits out, calibrated by the engine.

    The engine's guarantee callbacks fit ``calibration`` after every validation of ``fit``, keep it in
    each checkpoint and restore it, so a model that rewrites its steps keeps calibrated answers.
    """

    class_names: list[str]  # one name per output
    image_size: int  # the side it was trained at (the preprocessing record's size)
    multilabel: bool  # a sigmoid per class rather than one softmax
    normalize: Normalize  # the normalization inside the network: the preprocessing record's mean and std
    backbone: nn.Module  # the network's body and head (profiled, explained by class activation maps)
    calibration: Calibration  # temperature, thresholds, the "unknown" threshold
    test_time_augmentation: Callable[..., Tensor]  # the views evaluate() averages

    def network(self) -> nn.Module:
        """The inference network alone, normalization inside, calibrated logits out: what every export holds."""
        ...

    def evaluate(self, images: Tensor, all_views: bool = True) -> Tensor:
        """Logits of uint8 images (N, 3, S, S), averaged over the test-time views (one with all_views=False)."""
        ...

    def features(self, images: Tensor) -> Tensor:
        """The penultimate features (N, D) of uint8 images: what the classifier head takes."""
        ...


METHODS = ("network", "evaluate", "features")


def missing_of_class(model_class: type) -> list[str]:
    """What a model class lacks of the contract that can be seen before it is built."""
    missing = [f"{name}()" for name in METHODS if not callable(getattr(model_class, name, None))]
    parameters = inspect.signature(model_class.__init__).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    if "num_classes" not in parameters and not takes_any:
        missing.append("the constructor argument num_classes")
    return missing


def linked_settings(model_class: type) -> list[str]:
    """The data settings to link into ``model_class``: those of ``LinkedFromData`` its constructor takes."""
    parameters = inspect.signature(model_class.__init__).parameters
    return [name for name in LINKED_FROM_DATA if name in parameters]


def check_model_class(model_class: type) -> None:
    """Refuse, in one line, a model class that lacks a method or argument the engine calls."""
    missing = missing_of_class(model_class)
    if missing:
        raise UsageError(
            f"{model_class.__name__} lacks {', '.join(missing)} of classifier_engine.ClassifierModel; "
            "add them (the project's models/classifier.py shows each one)"
        )


def check_model(model: Any) -> None:
    """Refuse, in one line, a built model that lacks an attribute of the contract."""
    names: Sequence[str] = [*ClassifierModel.__annotations__, *METHODS]
    missing = [name for name in names if not hasattr(model, name)]
    if missing:
        raise UsageError(
            f"{type(model).__name__} lacks {', '.join(missing)} of classifier_engine.ClassifierModel; "
            "set them in its __init__ (the project's models/classifier.py shows each one)"
        )
