"""What the checkpoints and early stopping watch, for the labels the model has.

The configs choose the best checkpoint by ``val/top1``. A multi-label model has no top-1 accuracy;
it logs ``val/mAP`` (mean average precision over the classes), the figure such a model is judged by.
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info

from ..contract import ClassifierModel

SINGLE_LABEL_MONITOR, MULTILABEL_MONITOR = "val/top1", "val/mAP"


def monitor_what_the_labels_have(trainer: L.Trainer, model: ClassifierModel) -> None:
    """A multi-label model's checkpoints and early stopping watch val/mAP where the config says val/top1."""
    if not model.multilabel:
        return
    moved = []
    for callback in trainer.callbacks:
        if isinstance(callback, ModelCheckpoint | EarlyStopping) and callback.monitor == SINGLE_LABEL_MONITOR:
            callback.monitor = MULTILABEL_MONITOR  # public attribute: read at each check
            moved.append(type(callback).__name__)
    if moved:
        rank_zero_info(
            f"Labels: several per image, so {MULTILABEL_MONITOR} (mean average precision) replaces "
            f"{SINGLE_LABEL_MONITOR} as what {' and '.join(sorted(set(moved)))} monitor"
        )
