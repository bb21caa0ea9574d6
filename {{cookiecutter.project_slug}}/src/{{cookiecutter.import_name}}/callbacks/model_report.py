"""Say what the model costs before training it: parameters, MACs and FLOPs per image."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from ..export.flops import model_cost


class ModelReport(L.Callback):
    """Print the model's cost at fit start and log it as ``model/*`` hyperparameters."""

    def __init__(self, warn_above_gflops: float = 5.0) -> None:
        """Configure the warning.

        Args:
            warn_above_gflops: Warn when one image's forward pass needs more GFLOPs than this.
        """
        self.warn_above_gflops = warn_above_gflops

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        cost = model_cost(pl_module.network())
        rank_zero_info(f"ModelReport: {cost.describe()}")
        for logger in trainer.loggers:
            logger.log_hyperparams({f"model/{key}": value for key, value in cost.as_dict().items()})
        if cost.flops_per_image > self.warn_above_gflops * 1e9:
            rank_zero_warn(
                f"ModelReport: {cost.flops_per_image / 1e9:.2f} GFLOPs per image is above the "
                f"{self.warn_above_gflops:g} GFLOPs threshold; expect slow epochs"
            )
