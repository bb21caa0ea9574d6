"""A callback the DDP tests add on the command line to see what each rank was fed and ended with."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import lightning as L


class DataProbe(L.Callback):
    """Write ``rank<N>.json``: the sample ids of every training batch, per epoch, and a weights digest.

    The DDP tests write archives whose images carry their own index in the first two pixels
    (and train without augmentation), so ids are read from the data the rank really received.
    """

    def __init__(self, output_dir: str) -> None:
        self.output_dir = Path(output_dir)
        self.ids: dict[int, list[int]] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        pixels = batch[0][:, 0, 0, :2].long().cpu()
        self.ids.setdefault(trainer.current_epoch, []).extend((pixels[:, 0] * 256 + pixels[:, 1]).tolist())

    def on_train_end(self, trainer, pl_module) -> None:
        digest = hashlib.sha256()
        for name, tensor in sorted(pl_module.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        record = {"world_size": trainer.world_size, "ids": self.ids, "weights": digest.hexdigest()}
        self.output_dir.mkdir(parents=True, exist_ok=True)
        (self.output_dir / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))
