"""What a label is and what the loss weighs it by: one class per image or a set of them, and class weights.

``multiclass``: one class per image, a softmax over the classes, cross-entropy. ``multilabel``: any
set of classes per image (none included), one sigmoid per class, binary cross-entropy (or any loss
the config names, e.g. timm's ``AsymmetricLossMultiLabel``). Class weights are written in YAML
as ``balanced`` or ``{class name: weight}``; they weigh a class's term of the loss (multi-label:
its positive term, ``pos_weight``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import torch
from torch import Tensor, nn
from torchmetrics import MetricCollection
from torchmetrics.classification import (
    MulticlassAccuracy,
    MulticlassF1Score,
    MultilabelAveragePrecision,
    MultilabelF1Score,
)

Task = Literal["multiclass", "multilabel"]
ClassWeights = Literal["balanced"] | dict[str, float] | None
LossFactory = Callable[[], nn.Module]
# Most over fewest images per class above which balanced accuracy and macro-F1 are reported beside top-1.
IMBALANCED_ABOVE = 3.0


def is_imbalanced(class_counts: Sequence[int] | None) -> bool:
    """Whether the largest class has more than ``IMBALANCED_ABOVE`` times the images of the smallest."""
    if not class_counts or max(class_counts) <= 0:
        return False
    return min(class_counts) == 0 or max(class_counts) / min(class_counts) > IMBALANCED_ABOVE


def loss_weights(
    class_weights: ClassWeights,
    class_names: Sequence[str],
    class_counts: Sequence[int] | None,
    task: Task,
    images_counted: int | None,
) -> Tensor | None:
    """One weight per class for the loss (multi-label: for its positive term), or None for the plain loss.

    ``balanced``: N / (K x count) per class (multi-label: negatives / positives of each class, so a
    rare label's few positives weigh as much as its many negatives). A mapping gives some classes a
    weight; the others keep 1.
    """
    if class_weights is None:
        return None
    if isinstance(class_weights, Mapping):
        unknown = sorted(set(class_weights) - set(class_names))
        if unknown:
            raise ValueError(
                f"model.class_weights names {', '.join(map(str, unknown[:5]))}, which are not classes of this data "
                f"(its classes: {', '.join(class_names[:8])}{' ...' if len(class_names) > 8 else ''})"
            )
        if any(weight <= 0 for weight in class_weights.values()):
            raise ValueError(f"model.class_weights must be positive, got {dict(class_weights)}")
        return torch.tensor([float(class_weights.get(name, 1.0)) for name in class_names])
    if class_weights != "balanced":
        raise ValueError(
            f"model.class_weights must be null, balanced or a mapping of class to weight, got {class_weights!r}"
        )
    if not class_counts or min(class_counts) <= 0 or (task == "multilabel" and not images_counted):
        raise ValueError(
            "model.class_weights: balanced needs the training images of every class, which this data does not give "
            f"(class_counts: {class_counts}); give a weight per class name instead"
        )
    counts = torch.tensor(class_counts, dtype=torch.float32)
    if task == "multilabel":
        return ((images_counted - counts) / counts).clamp(min=1e-3)
    return counts.sum() / (len(counts) * counts)


class MultilabelBCE(nn.BCEWithLogitsLoss):
    """Binary cross-entropy summed over the classes and averaged over the images.

    torch's default averages over images x classes too, which divides every logit's gradient by the number
    of classes: with 10 classes the head learns ten times slower than under cross-entropy at the same
    learning rate, and the recipes' rates are cross-entropy's. Summed over the classes (as timm's asymmetric
    loss does, ``batchmean``), a multi-label model trains at the rate its config gives.
    """

    def __init__(self, pos_weight: Tensor | None = None) -> None:
        super().__init__(reduction="none", pos_weight=pos_weight)

    def forward(self, logits: Tensor, targets: Tensor) -> Tensor:
        return super().forward(logits, targets).sum(dim=1).mean()


def build_loss(task: Task, loss: LossFactory | None, weights: Tensor | None, label_smoothing: float) -> nn.Module:
    """The training loss: the config's (``weights`` passed as its ``weight``/``pos_weight``), else the task's own."""
    keyword = "pos_weight" if task == "multilabel" else "weight"
    if loss is None:
        if task == "multilabel":
            return MultilabelBCE(pos_weight=weights)
        return nn.CrossEntropyLoss(weight=weights, label_smoothing=label_smoothing)
    try:
        return loss(**({keyword: weights} if weights is not None else {}))
    except TypeError as error:
        raise ValueError(
            f"model.loss cannot take the class weights as {keyword} ({error}); set model.class_weights: null"
        ) from error


def evaluation_metrics(task: Task, num_classes: int, imbalanced: bool) -> MetricCollection:
    """The metrics of a validation or test pass.

    Multi-class: top-1 and top-5 accuracy, with balanced accuracy (the mean recall over classes) and
    macro-F1 when the classes are imbalanced. Multi-label: mean average precision over classes (mAP,
    threshold-free) and macro/micro F1 with every class at probability 0.5 (the thresholds fitted on
    validation are the report's and the card's).
    """
    if task == "multilabel":
        return MetricCollection(
            {
                "mAP": MultilabelAveragePrecision(num_classes, average="macro"),
                "f1_macro": MultilabelF1Score(num_classes, average="macro"),
                "f1_micro": MultilabelF1Score(num_classes, average="micro"),
            },
            compute_groups=False,
        )
    metrics = {
        "top1": MulticlassAccuracy(num_classes, top_k=1, average="micro"),
        "top5": MulticlassAccuracy(num_classes, top_k=min(5, num_classes), average="micro"),
    }
    if imbalanced:
        metrics["balanced_accuracy"] = MulticlassAccuracy(num_classes, average="macro")
        metrics["f1_macro"] = MulticlassF1Score(num_classes, average="macro")
    # No compute groups: torchmetrics would merge metrics whose states happen to be equal after the first batch
    # (top-1 and top-5 when every image of it is right at top-1), and the merged one reports the other's value.
    return MetricCollection(metrics, compute_groups=False)
