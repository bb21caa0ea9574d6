"""The run's data, asked of the run's own DataModule: training images to calibrate int8, the held-out split to judge.

The DataModule is the config's, built with the plain settings the checkpoint records (its split's
sizes and seed: ``checkpoint_values``), its state is restored (which packed copy the run read, by
name under the config's cache folder, and which images it held out), then it is prepared and set up
for ``test``. So whichever DataModule a run trained with
(CIFAR, a folder of images, a subclass of either, or your own ``ImageDataModule``), an export reads
the images the run read, split as the run split them, through the ``EvaluationData`` protocol
(``data/interfaces.py``). Nothing here knows a dataset by name. Export never downloads: the DataModule is
``offline``; missing data is one line that says which folder to pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import lightning as L
import numpy as np

from ..data.interfaces import EvaluationData, HeldOutImages
from ..foundation.errors import UsageError, UserError, parse_error_line
from .model_loading import LoadedModel


class MissingDataError(UsageError):
    """The images an export step needs cannot be read; the message says what to pass."""


@dataclass(frozen=True)
class RunData:
    """The rebuilt DataModule, set up, and the split it holds out."""

    datamodule: EvaluationData
    held_out: HeldOutImages

    def calibration_images(self, count: int) -> np.ndarray:
        """Training images, never held-out ones, drawn by a fixed seed."""
        return self.datamodule.training_sample(count, seed=0)


def load_run_data(
    loaded: LoadedModel, ckpt_path: Path, class_names: list[str], data_dir: Path | None, purpose: str
) -> RunData:
    """The DataModule built for ``loaded``'s checkpoint, its recorded state restored, set up for ``test``.

    ``data_dir``: where to read instead; ``purpose`` says in an error what the images were wanted for.
    """
    datamodule = loaded.datamodule
    if not (isinstance(datamodule, L.LightningDataModule) and isinstance(datamodule, EvaluationData)):
        raise MissingDataError(
            f"the config's DataModule {type(datamodule).__name__} cannot hand out its images to an export (it is no "
            "ImageDataModule); export with --formats onnx,pt2, which needs no data"
        )
    without = "" if purpose.startswith("int8") else " (or --eval_limit 0 to export without measuring)"
    state = loaded.checkpoint.get(type(datamodule).__qualname__)  # where Lightning keeps a DataModule's state
    try:
        if isinstance(state, dict):
            datamodule.load_state_dict(state)
        datamodule.offline = True
        if data_dir is not None:
            datamodule.use_data_dir(data_dir)
        datamodule.prepare_data()
        datamodule.setup("test")
    except (UserError, ValueError, OSError) as error:
        where = "pass --data_dir with the folder that holds them" if data_dir is None else "check --data_dir"
        raise MissingDataError(
            f"{purpose} needs the run's images, which its {type(datamodule).__name__} cannot read here: "
            f"{parse_error_line(str(error))}; {where}, or --config with the run's config.yaml{without}"
        ) from error
    if list(datamodule.class_names) != list(class_names):
        raise MissingDataError(
            f"the data {datamodule.title} has other classes than the model ({len(datamodule.class_names)} vs "
            f"{len(class_names)}: {list(datamodule.class_names)[:3]}... vs {list(class_names)[:3]}...); "
            "pass --data_dir with the data the run trained on"
        )
    return RunData(datamodule, datamodule.held_out_images())
