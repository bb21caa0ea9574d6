"""Every random stream of the run in its checkpoints, so a resumed run draws what it would have drawn.

Saved: Python's ``random``, NumPy's global generator, torch's CPU generator and every CUDA
generator (the data order is drawn from torch's CPU generator at each epoch start; the
device augmentation needs no saved state: its generator is re-seeded from the run seed, the
rank and the epoch, and replays skipped batches on resume, see data/augment.py). States are restored at
the start of training, after the sanity-check validation, which draws from the same
generators and would otherwise shift them.
"""

from __future__ import annotations

import random
from typing import Any

import lightning as L
import numpy as np
import torch
from typing_extensions import override


class RandomState(L.Callback):
    """Save the global random generators' states in checkpoints and restore them on resume."""

    def __init__(self) -> None:
        self._pending: dict[str, Any] | None = None

    @override
    def state_dict(self) -> dict[str, Any]:
        kind, keys, position, has_gauss, cached = np.random.get_state()
        return {
            "python": random.getstate(),
            "numpy": [kind, keys.tolist(), position, has_gauss, cached],
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = state_dict

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._pending is None:
            return
        state, self._pending = self._pending, None
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
        kind, keys, position, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), position, has_gauss, cached))
        torch.set_rng_state(state["torch"])
        if state["cuda"] and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(state["cuda"])
