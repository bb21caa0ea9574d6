"""``predict`` writes ``predictions.csv`` in its run folder: one row per image, its answer and the top 5.

The model's ``predict_step`` returns calibrated probabilities with, for one label per image, which
images get an answer (the others are "unknown"), or, for several labels per image, which labels each
gets; a model that returns bare probabilities gets its top class every time.
"""

from __future__ import annotations

import contextlib
import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
from lightning.pytorch.callbacks import BasePredictionWriter
from torch import Tensor
from typing_extensions import override

from ..data.interfaces import PredictionNames
from ..foundation.files import Partial
from ..models.answers import answers


class PredictionWriter(BasePredictionWriter):
    """Rows ``image, predicted, probability, unknown_because, score, top5`` (``top5`` as ``name:probability``
    pairs), written per batch.

    ``predicted`` is ``unknown`` where the image is unlike the training images (its ``score``, how like them it
    is, is below the fitted threshold) or the answer is likely a mistake; ``unknown_because`` says which, and
    ``top5`` still ranks the classes. For a multi-label model the rows are ``image, labels, probabilities,
    unknown_because, score, top5``: every label at or above its threshold, separated by spaces, and their
    probabilities; ``unknown`` (no labels) for an image unlike the training images.

    ``image`` is the test-set index, or the file's path inside ``data.predict_dir``. The file is
    written under a temporary name and renamed when prediction ends, so a stopped run leaves no
    half file. Under DDP each rank writes ``predictions-rank<N>.csv`` for its disjoint share.
    """

    def __init__(self, filename: str = "predictions.csv", top_k: int = 5) -> None:
        """Configure the file.

        Args:
            filename: Name of the CSV file in the predict run's folder.
            top_k: How many of the most probable classes each row lists.
        """
        super().__init__(write_interval="batch")
        self.filename = filename
        self.top_k = top_k
        self.path: Path | None = None
        self._handle = None
        self._writer = None
        self._partial: Partial | None = None

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "predict":
            return
        log_dir = Path(trainer.log_dir or trainer.default_root_dir)  # a collective call: every rank makes it
        name = self.filename if trainer.world_size == 1 else f"{Path(self.filename).stem}-rank{trainer.global_rank}.csv"
        self.path = log_dir / name
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._partial = Partial(self.path)
        self._handle = open(self._partial.path, "w", newline="")  # noqa: SIM115 (closed in on_predict_end/teardown)
        self._writer = csv.writer(self._handle)
        self._header_written = False

    @override
    def write_on_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        prediction: Tensor,
        batch_indices: Sequence[int] | None,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        data = trainer.datamodule
        name = data.predict_name if isinstance(data, PredictionNames) else str
        answer = prediction if isinstance(prediction, dict) else {"probabilities": prediction}
        all_p = answer["probabilities"].float()
        class_names = getattr(pl_module, "class_names", None) or [str(i) for i in range(all_p.shape[-1])]
        multilabel = "labels" in answer
        if not self._header_written:
            first = ["labels", "probabilities"] if multilabel else ["predicted", "probability"]
            self._writer.writerow(["image", *first, "unknown_because", "score", f"top{self.top_k}"])
            self._header_written = True
        indices = batch_indices if batch_indices is not None else range(len(all_p))

        def array(key: str) -> np.ndarray | None:
            return answer[key].cpu().numpy() if key in answer else None

        rows = answers(
            all_p.cpu().numpy(),
            class_names,
            array("in_domain"),
            array("answered"),
            array("labels"),
            array("score"),
            self.top_k,
        )  # the server's answers are made by the same function
        try:
            for index, row in zip(indices, rows, strict=True):
                self._writer.writerow([name(index), *row.cells()])
        except OSError as error:  # a full disk: say so, and leave no partial file
            with contextlib.suppress(OSError):  # the buffered rows cannot be written either
                self._close()
            self._partial.discard_after(error)
            raise

    @override
    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._handle is not None:
            with self._partial:  # committed once complete; a full disk at the last flush is NoSpaceError
                self._close()
            print(f"Predictions: {self.path}")

    def _close(self) -> None:
        handle, self._handle = self._handle, None
        handle.close()

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._handle is not None:  # prediction did not end: leave nothing behind
            with contextlib.suppress(OSError):  # rows that could not be written are discarded anyway
                self._close()
            self._partial.discard()

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """A run that fails before its teardown (a refused checkpoint at restore): the file is closed and dropped."""
        self.teardown(trainer, pl_module, "predict")
