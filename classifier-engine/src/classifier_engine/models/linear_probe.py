"""A logistic regression on frozen features, its L2 strength chosen on folds of the training images.

On a few hundred photos the pretrained features already hold most of the answer: a linear probe on them
is the strongest simple baseline, a fine-tune that loses to it has spent what the weights knew, and it is
the head a fine-tune should start from (LP-FT, Kumar et al. 2022). Fitted to convergence with L-BFGS
(full batch, float64, on the CPU: the same figures on every machine), it takes seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

# The L2 strengths tried, on the mean loss (sklearn's C = 1 / (l2 * images)): from nearly free to strongly held.
L2_GRID: tuple[float, ...] = tuple(float(value) for value in np.logspace(-5, 1, 13))
# The search goes from strong to weak and stops this many strengths past the best: the held-out score rises
# to one peak and falls, and the weak end (nearly separable, hundreds of L-BFGS steps) is the slow one.
PATIENCE = 3


@dataclass(frozen=True)
class ProbeFit:
    """The fitted head in the features' own units (the standardization folded in), and how it was chosen."""

    weight: Tensor  # (classes, features)
    bias: Tensor  # (classes,)
    l2: float  # the strength the folds chose
    folds_score: float  # its mean held-out score over the folds: top-1 (one label) or label accuracy (several)


def probe_score(logits: Tensor, targets: Tensor, multilabel: bool) -> float:
    """Top-1 accuracy of one label per image; with several labels, the share of (image, label) answers right."""
    if multilabel:
        return float(((logits > 0) == (targets > 0.5)).float().mean())
    return float((logits.argmax(1) == targets).float().mean())


def _loss(logits: Tensor, targets: Tensor, multilabel: bool) -> Tensor:
    if multilabel:  # one logistic regression per class
        return F.binary_cross_entropy_with_logits(logits, targets, reduction="sum") / len(targets)
    return F.cross_entropy(logits, targets)


def _fit(
    x: Tensor, targets: Tensor, classes: int, multilabel: bool, l2: float, start: tuple[Tensor, Tensor] | None
) -> tuple[Tensor, Tensor]:
    weight = torch.zeros(classes, x.shape[1], dtype=x.dtype) if start is None else start[0].clone()
    bias = torch.zeros(classes, dtype=x.dtype) if start is None else start[1].clone()
    weight.requires_grad_(True)
    bias.requires_grad_(True)
    solver = torch.optim.LBFGS(
        [weight, bias], lr=1.0, max_iter=500, tolerance_grad=1e-7, tolerance_change=1e-10, line_search_fn="strong_wolfe"
    )

    def objective() -> Tensor:
        solver.zero_grad()
        loss = _loss(x @ weight.T + bias, targets, multilabel) + 0.5 * l2 * weight.pow(2).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        solver.step(objective)
    return weight.detach(), bias.detach()


def fit_linear_probe(
    features: Tensor, targets: Tensor, groups: Tensor, classes: int, multilabel: bool, folds: int = 5, seed: int = 0
) -> ProbeFit:
    """The L2 strength with the best mean score on ``folds`` held-out folds, then the head refitted on all rows.

    Args:
        features: (N, D) frozen features, a row per view (an image and its mirror are two rows).
        targets: (N,) class indices, or (N, C) rows of 0/1 with several labels.
        groups: (N,) which image each row is: a group's rows share a fold (no mirror helps answer itself).
        classes: How many classes.
        multilabel: Several labels per image (a logistic per class) rather than one of ``classes``.
        folds: Held-out folds the strength is chosen on (fewer when there are fewer images).
        seed: The folds' draw.
    """
    x = features.detach().to("cpu", torch.float64)
    y = targets.detach().to("cpu", torch.float64 if multilabel else torch.long)
    mean, scale = x.mean(0), x.std(0).clamp_min(1e-6)
    x = (x - mean) / scale
    images = torch.unique(groups.cpu())
    folds = max(2, min(folds, len(images)))
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed))
    fold_of = torch.empty(int(images.max()) + 1, dtype=torch.long)
    fold_of[images[order]] = torch.arange(len(images)) % folds
    row_fold = fold_of[groups.cpu()]
    scores: list[float] = []
    starts: dict[int, tuple[Tensor, Tensor]] = {}
    for l2 in sorted(L2_GRID, reverse=True):  # from strong to weak: each fit starts where the stronger one ended
        if len(scores) - int(np.argmax(scores or [0.0])) > PATIENCE:
            break
        fold_scores = []
        for fold in range(folds):
            train, held = row_fold != fold, row_fold == fold
            starts[fold] = _fit(x[train], y[train], classes, multilabel, l2, starts.get(fold))
            weight, bias = starts[fold]
            fold_scores.append(probe_score(x[held] @ weight.T + bias, y[held], multilabel))
        scores.append(float(np.mean(fold_scores)))
    strengths = sorted(L2_GRID, reverse=True)
    best = int(np.argmax(scores))  # the first best: the strongest L2 among equals
    weight, bias = _fit(x, y, classes, multilabel, strengths[best], None)
    # Standardized inputs folded into the layer: W x' + b with x' = (x - mean) / scale.
    folded_weight = weight / scale
    folded_bias = bias - (folded_weight * mean).sum(1)
    return ProbeFit(folded_weight.float(), folded_bias.float(), strengths[best], scores[best])
