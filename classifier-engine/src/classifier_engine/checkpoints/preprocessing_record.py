"""Every checkpoint keeps how its model's images were made (``data/preprocessing.py``), whatever the callbacks list."""

from __future__ import annotations

from typing import Any

import lightning as L
from typing_extensions import override

from ..data.datamodule import ImageDataModule
from ..data.preprocessing import CHECKPOINT_KEY


class PreprocessingRecord(L.Callback):
    """Write the DataModule's preprocessing record into each checkpoint, with the normalization the model uses."""

    @override
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        data = trainer.datamodule
        if not isinstance(data, ImageDataModule):
            return  # a DataModule of another kind states no record; readers fall back to the saved settings
        record = data.preprocessing().as_dict()
        # The network normalizes with the model's own (linked from the data's): the contract's ``normalize``.
        record["mean"], record["std"] = list(pl_module.normalize.mean), list(pl_module.normalize.std)
        checkpoint[CHECKPOINT_KEY] = record
