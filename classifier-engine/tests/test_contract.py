"""The public API and the guarantees' units: what semver covers, and what the installed callbacks count."""

from __future__ import annotations

import inspect
import warnings
from types import SimpleNamespace

import pytest
import torch

import classifier_engine
from classifier_engine.cli.model_guarantees import TrainingTotalsLog


def test_every_public_name_resolves_and_says_what_it_is_for():
    for name in classifier_engine.__all__:
        value = getattr(classifier_engine, name)
        if inspect.isclass(value) or inspect.isfunction(value):  # type aliases and constants aside
            assert (value.__doc__ or "").strip(), f"classifier_engine.{name} has no docstring"
    with pytest.raises(AttributeError, match="no attribute 'ImageClassifier'"):
        classifier_engine.ImageClassifier  # noqa: B018  (the project's, never the library's)


def test_a_renamed_public_name_keeps_working_with_a_warning(monkeypatch):
    monkeypatch.setitem(classifier_engine._RENAMED, "BatchAugmentation", "BatchAugment")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert classifier_engine.BatchAugmentation is classifier_engine.BatchAugment
    assert [w.category for w in caught] == [DeprecationWarning]
    assert "classifier_engine.BatchAugment" in str(caught[0].message)


def test_training_totals_count_mixed_images_as_their_larger_share_and_a_bare_loss_as_a_loss():
    totals = TrainingTotalsLog()
    model = SimpleNamespace(class_names=["a", "b", "c"], multilabel=False, log=lambda *args, **kwargs: None)
    trainer = SimpleNamespace(log_every_n_steps=0, should_stop=False, global_step=1)
    totals.setup(trainer, model, "fit")
    shares = torch.tensor([[0.7, 0.3, 0.0], [0.0, 0.6, 0.4], [0.2, 0.0, 0.8], [1.0, 0.0, 0.0]])
    logits = torch.tensor([[2.0, 0, 0], [0, 0, 3.0], [0, 0, 1.0], [0, 1.0, 0]])
    totals.on_train_batch_end(trainer, model, {"loss": torch.tensor(0.5), "logits": logits}, (None, shares), 0)
    assert totals.totals.images == 4 and int(totals.totals.sums[1]) == 2  # images 0 and 2: their larger share
    strategy = SimpleNamespace(root_device=torch.device("cpu"), world_size=1)
    assert set(totals.totals.means(strategy)) == {"train/loss_epoch", "train/top1", "train/top5"}
    totals.on_train_batch_end(trainer, model, {"loss": torch.tensor(0.25)}, (None, torch.tensor([0, 1])), 1)
    means = totals.totals.means(strategy)
    assert set(means) == {"train/loss_epoch"}  # no logits, no accuracy to claim
    assert float(means["train/loss_epoch"]) == pytest.approx((0.5 * 4 + 0.25 * 2) / 6)
