"""A fold ensemble's logits: whatever softmax or sigmoid a runtime applies gives the folds' mean probabilities."""

from __future__ import annotations

import torch

from classifier_engine.cross_validation.fold_ensemble import mean_probability_logits


def test_softmax_of_the_ensemble_logits_is_the_mean_of_the_folds_probabilities_even_where_they_are_extreme():
    logits = torch.tensor([[[100.0, -100.0, 0.0]], [[-100.0, 100.0, 0.0]], [[0.0, 0.0, 3.0]]], dtype=torch.float64)
    combined = mean_probability_logits(logits, multilabel=False)
    assert torch.isfinite(combined).all()
    assert torch.allclose(combined.softmax(-1), logits.softmax(-1).mean(0), atol=1e-12)


def test_sigmoid_of_the_ensemble_logits_is_each_label_s_mean_probability():
    logits = torch.tensor([[[60.0, -60.0, 1.0]], [[-60.0, -60.0, -1.0]]], dtype=torch.float64)
    combined = mean_probability_logits(logits, multilabel=True)
    assert torch.isfinite(combined).all()
    assert torch.allclose(combined.sigmoid(), logits.sigmoid().mean(0), atol=1e-12)
    assert combined[0, 1] < -59  # both folds sure the label is absent: so is the ensemble
