"""What the library's command tests add to the reference model: a signal at a chosen batch, a model lacking a method.

``python probes.py MODEL ARGS`` runs the reference project's ``main.py ARGS`` with ``MODEL`` of this file.
"""

from __future__ import annotations

import os
import signal
import sys

import lightning as L

from classifier_engine.testing.reference import REFERENCE_CONFIG, ReferenceClassifier


class SignalAt(L.Callback):
    """SIGTERM this process after training batch B of epoch E when ``SIGNAL_AT`` is ``E:B`` (a scheduler's stop)."""

    def __init__(self) -> None:
        self.moment = os.environ.get("SIGNAL_AT", "")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.moment == f"{trainer.current_epoch}:{batch_idx}":
            os.kill(os.getpid(), signal.SIGTERM)


class NoFeatures(ReferenceClassifier):
    """A model that dropped a method of the contract."""

    features = None


if __name__ == "__main__":
    from classifier_engine import run_main

    model = globals()[sys.argv.pop(1)]
    run_main(model, REFERENCE_CONFIG)
