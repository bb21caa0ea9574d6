"""``fit --recipe probe``: the config's run with the linear probe alone, as an ordinary run of one step."""

from __future__ import annotations

from typing import Literal

from jsonargparse import Namespace

from .guarantees import as_list

Recipe = Literal["finetune", "probe"]
LINEAR_PROBE = "classifier_engine.callbacks.LinearProbe"


def probe_alone(trainer: Namespace) -> None:
    """Set the trainer's config for the probe alone: the config's ``LinearProbe`` (or one added) with no fine-tune,
    and one epoch of one step, whose update the probe drops, so the run validates, calibrates and checkpoints."""
    callbacks = as_list(trainer.get("callbacks"))
    probes = [callback for callback in callbacks if is_linear_probe(callback)]
    if not probes:
        probes = [Namespace(class_path=LINEAR_PROBE, init_args=Namespace())]
        callbacks.append(probes[0])
    for probe in probes:
        if probe.get("init_args") is None:
            probe.init_args = Namespace()
        probe.init_args.fine_tune = False
    trainer.callbacks = callbacks
    trainer.max_epochs, trainer.max_steps, trainer.limit_train_batches = 1, -1, 1


def is_linear_probe(callback: object) -> bool:
    path = callback.get("class_path", "") if isinstance(callback, Namespace) else ""
    return path in (LINEAR_PROBE, "classifier_engine.callbacks.linear_probe.LinearProbe")
