"""Say what the model costs before training it, and put it beside the run's settings in TensorBoard."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.tensorboard.summary import hparams
from typing_extensions import override

from ..data.interfaces import BatchPlan
from ..models.cost import model_cost
from .tensorboard import tensorboard_writers

# The scalars the HPARAMS tab shows beside each run's settings (their latest values).
COMPARED_METRICS = ("val/top1", "val/top5", "val/loss", "train/loss_epoch")


def flat_settings(prefix: str, settings: dict[str, Any]) -> dict[str, int | float | str | bool]:
    """``{prefix/key: value}`` with values TensorBoard's HPARAMS tab can show (others as text, None left out)."""
    flat: dict[str, int | float | str | bool] = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            flat.update(flat_settings(f"{prefix}/{key}", value))
        elif value is not None and not key.startswith("_"):  # jsonargparse's own bookkeeping
            flat[f"{prefix}/{key}"] = value if isinstance(value, int | float | str | bool) else str(value)
    return flat


class ModelReport(L.Callback):
    """Print the model's cost at fit start; log it with the run's settings to TensorBoard's HPARAMS and TEXT tabs.

    The HPARAMS tab then lists every run of the experiment side by side: parameters, MACs and
    FLOPs per image, the model's and the data's settings, and the latest ``val/*`` values.
    """

    def __init__(self, warn_above_gflops: float = 5.0) -> None:
        """Configure the warning.

        Args:
            warn_above_gflops: Warn when one image's forward pass needs more GFLOPs than this.
        """
        self.warn_above_gflops = warn_above_gflops

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        cost = model_cost(pl_module.network(), pl_module.image_size)
        rank_zero_info(f"ModelReport: {cost.describe()}")
        costs = {f"cost/{key}": value for key, value in cost.as_dict().items()}  # sorts first in the HPARAMS tab
        for logger in trainer.loggers:
            logger.log_hyperparams(costs)
        settings = {
            **costs,
            **flat_settings("model", dict(pl_module.hparams)),
            **flat_settings("data", dict(getattr(trainer.datamodule, "hparams", {}))),
        }
        data = trainer.datamodule
        if isinstance(data, BatchPlan) and data.batches is not None:  # what the settings come to on these devices
            settings["data/images_per_step"] = data.batches.per_step
        for writer in tensorboard_writers(trainer, self, "the model's cost"):
            writer.add_text("model/cost", cost.describe(), trainer.global_step)
            # Written as Lightning's TensorBoardLogger writes hparams, without logging metric values. The public
            # add_hparams would write them into a new sub-run folder, apart from the run's scalars; the private
            # file writer is Lightning's route too (tests/test_private_routes.py fails if an upgrade moves it).
            for summary in hparams(settings, dict.fromkeys(COMPARED_METRICS, 0.0)):
                writer._get_file_writer().add_summary(summary)
        if cost.flops_per_image > self.warn_above_gflops * 1e9:
            rank_zero_warn(
                f"ModelReport: {cost.flops_per_image / 1e9:.2f} GFLOPs per image is above the "
                f"{self.warn_above_gflops:g} GFLOPs threshold; expect slow epochs"
            )
