"""The run's data, asked of the run's own DataModule: training images to calibrate int8, the held-out split to judge.

The DataModule is rebuilt as the checkpoint records it (LightningCLI records its class path and
every setting), its state is restored (e.g. which packed copy the run read and which images it
held out), then it is prepared and set up for ``test``. So whichever DataModule a run trained with
(CIFAR, a folder of images, a subclass of either, or your own ``ImageDataModule``), an export reads
the images the run read, split as the run split them, through the ``EvaluationData`` protocol
(``data/interfaces.py``). Nothing here knows a dataset by name. Export never downloads: the DataModule is
``offline``; missing data is one line that says which folder to pass.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np

from ...data.interfaces import EvaluationData, HeldOutImages
from ...foundation.errors import UsageError, UserError, parse_error_line


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


def accepted_arguments(cls: type) -> set[str]:
    """The constructor arguments of ``cls``, following ``**kwargs`` up to the base classes that take them."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        parameters = inspect.signature(klass.__init__).parameters.values()
        names |= {p.name for p in parameters if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name != "self"}
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            break
    return names


def datamodule_class(checkpoint: dict) -> type[L.LightningDataModule]:
    """The class the run's DataModule was, imported (as LightningCLI imported it from ``data.class_path``)."""
    class_path = checkpoint.get("datamodule_hyper_parameters", {}).get("_class_path")
    if not class_path:
        raise MissingDataError(
            "the checkpoint does not record the run's DataModule (it was not written by main.py fit); "
            "export it with --formats onnx,pt2, which needs no data"
        )
    module_name, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as error:
        raise MissingDataError(
            f"the run's DataModule {class_path} cannot be imported here ({error}); install the package that defines "
            "it, or put its folder on PYTHONPATH"
        ) from error
    if not (isinstance(cls, type) and issubclass(cls, L.LightningDataModule) and issubclass(cls, EvaluationData)):
        raise MissingDataError(
            f"the run's DataModule {class_path} cannot hand out its images to an export (it is no ImageDataModule); "
            "export it with --formats onnx,pt2, which needs no data"
        )
    return cls


def load_run_data(
    ckpt_path: Path, checkpoint: dict, class_names: list[str], data_dir: Path | None, purpose: str
) -> RunData:
    """The run's DataModule rebuilt from ``ckpt_path``, set up for ``test`` (``data_dir``: where to read instead).

    ``purpose`` says in an error what the images were wanted for.
    """
    cls = datamodule_class(checkpoint)
    accepted = accepted_arguments(cls)
    overrides: dict[str, Any] = {"class_names": list(class_names)} if "class_names" in accepted else {}
    without = "" if purpose.startswith("int8") else " (or --eval_limit 0 to export without measuring)"
    try:
        datamodule = cls.load_from_checkpoint(ckpt_path, map_location="cpu", weights_only=True, **overrides)
        datamodule.offline = True
        if data_dir is not None:
            datamodule.use_data_dir(data_dir)
        datamodule.prepare_data()
        datamodule.setup("test")
    except (UserError, ValueError, OSError) as error:
        where = "pass --data_dir with the folder that holds them" if data_dir is None else "check --data_dir"
        raise MissingDataError(
            f"{purpose} needs the run's images, which its {cls.__name__} cannot read here: "
            f"{parse_error_line(str(error))}; {where}{without}"
        ) from error
    if list(datamodule.class_names) != list(class_names):
        raise MissingDataError(
            f"the data {datamodule.title} has other classes than the model ({len(datamodule.class_names)} vs "
            f"{len(class_names)}: {list(datamodule.class_names)[:3]}... vs {list(class_names)[:3]}...); "
            "pass --data_dir with the data the run trained on"
        )
    return RunData(datamodule, datamodule.held_out_images())
