"""How unlike the training images an image is, on the network's own penultimate features.

A classifier's logits say how sure it is between its classes, not whether the image is of their kind at
all: a two-class head trained on ants and bees is confident on a photo of a handwritten digit, because
that photo lands far from the boundary between the two. The features the head reads (the contract's
``features()``) do place a digit far from every ant and bee.

The shipped score is the distance to the k-th nearest training image after L2 normalization (Sun et al.,
"Out-of-distribution detection with deep nearest neighbors", ICML 2022): it assumes nothing of the feature
distribution, needs no class to be a Gaussian, and works alike for one label or several per image. Its
sign is flipped (higher: more like the training images), as the logit scores ``msp`` and ``energy`` are.

The bank of training features is what the checkpoint keeps: fp16, at most ``BANK_BYTES``, drawn with a
fixed seed where the training images are more. Sun et al. keep most of the score's power with a random
1% of ImageNet, scaling k with the share kept (k = 1000 on all of ImageNet, 10 on 1%; 50 on CIFAR-10's
50,000 images): ``neighbours()`` follows that rule, one neighbour per thousand bank images, at least five.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

DomainScore = Literal["knn", "energy", "msp", "none"]
DOMAIN_SCORES: tuple[str, ...] = ("knn", "energy", "msp")
BANK_BYTES = 20 * 2**20  # the checkpoint's bank of training features, at most (fp16)
BANK_IMAGES = 5000  # training images whose features are computed after each validation, at most
BANK_SEED = 0


def bank_capacity(dimension: int, images: int = BANK_IMAGES) -> int:
    """How many fp16 feature rows of ``dimension`` the bank keeps: within ``BANK_BYTES`` and ``images``."""
    return max(1, min(images, BANK_BYTES // (2 * max(dimension, 1))))


MIN_NEIGHBOURS = 5  # a small folder's one odd photo (a drawing, a scan) must not vouch for every image like it


def neighbours(bank_size: int) -> int:
    """k of the k-th nearest neighbour for a bank of this size: Sun et al.'s k per share of the training set
    (one per thousand images), at least ``MIN_NEIGHBOURS``, at most the bank.

    At k = 1, on the ants and bees photos (245 training images), one training image among them made every
    handwritten digit look like the training images (digits answered unknown: 20 %); from k = 3 on, 100 %,
    and photos of clothing 98 % at k = 5 (94 % at k = 10).
    """
    return max(1, min(bank_size, max(MIN_NEIGHBOURS, round(bank_size / 1000))))


def normalized_bank(features: Tensor) -> Tensor:
    """Training features as the bank keeps them: L2-normalized rows, fp16, on the CPU."""
    return torch.nn.functional.normalize(features.detach().float(), dim=1).half().cpu()


def knn_scores(features: Tensor, bank: Tensor, k: int | None = None, chunk: int = 1024) -> Tensor:
    """Minus the Euclidean distance from each L2-normalized feature row to its k-th nearest bank row.

    On unit vectors the distance is ``sqrt(2 - 2 cos)``, so the k-th nearest is the k-th largest cosine:
    one matrix product per ``chunk`` rows, never an (N, bank) matrix larger than that.
    """
    if not len(bank):
        return torch.zeros(len(features), device=features.device)
    k = neighbours(len(bank)) if k is None else max(1, min(k, len(bank)))
    unit = torch.nn.functional.normalize(features.float(), dim=1)
    bank = bank.to(device=features.device, dtype=torch.float32)
    scores = []
    for start in range(0, len(unit), chunk):
        cosine = unit[start : start + chunk] @ bank.T
        kth = cosine.topk(k, dim=1).values[:, -1]
        scores.append(-(2 - 2 * kth).clamp_min(0).sqrt())
    return torch.cat(scores) if scores else torch.zeros(0, device=features.device)


def keeping_threshold(scores: Tensor, keep: float) -> float:
    """The threshold (``score >= t`` is in the domain) that keeps ``keep`` of these images.

    Halfway between the last image kept and the first one left out, so a runtime that computes the score
    a hair differently answers the same.
    """
    ordered = torch.sort(scores.double()).values
    if not len(ordered) or keep >= 1:
        return -math.inf
    drop = math.floor(round((1 - keep) * len(ordered), 9))
    if drop == 0:
        return float(ordered[0]) - 1e-6
    return (float(ordered[drop - 1]) + float(ordered[drop])) / 2


def knn_graph_scores(features: Tensor, bank: Tensor, k: int) -> Tensor:
    """``knn_scores`` in one expression, as an exported graph computes it (no loop over a dynamic batch)."""
    cosine = torch.nn.functional.normalize(features, dim=1) @ bank.T
    return -(2 - 2 * cosine.topk(k, dim=1).values[:, -1]).clamp_min(0).sqrt()


def find_head(model: nn.Module, images: Tensor) -> nn.Module:
    """The module of ``model.backbone`` whose input ``model.features(images)`` returns: the classifier head.

    Found by watching every module once, so an exported graph can take the features from the same forward pass
    as the logits, for any network the contract admits.
    """
    calls: list[tuple[nn.Module, Tensor]] = []

    def watch(module: nn.Module, args: tuple) -> None:
        if args and isinstance(args[0], Tensor):
            calls.append((module, args[0]))

    handles = [module.register_forward_pre_hook(watch) for module in model.backbone.modules()]
    try:
        with torch.no_grad():
            features = model.features(images)
    finally:
        for handle in handles:
            handle.remove()
    for module, received in reversed(calls):
        flat = received.flatten(1)
        if flat.shape == features.shape and torch.equal(flat, features):
            return module
    raise ValueError("no module of the backbone receives what features() returns")


def logit_score(calibrated: Tensor, temperature: Tensor, score: str, multilabel: bool) -> Tensor:
    """A score of calibrated logits (higher: surer): ``energy``, T x logsumexp(logits) (multi-label: JointEnergy,
    the sum of log(1 + e^x)), or else ``msp``, the top calibrated probability (multi-label: the top sigmoid).
    One definition for the checkpoint's thresholds and the exported graphs that are held to them."""
    if score == "energy":
        if multilabel:
            return nn.functional.softplus(calibrated).sum(dim=-1)
        return temperature * torch.logsumexp(calibrated, dim=-1)
    probabilities = calibrated.sigmoid() if multilabel else calibrated.softmax(dim=-1)
    return probabilities.max(dim=-1).values


class ScoredNetwork(nn.Module):
    """The inference network with the "unknown" score beside the calibrated logits: ``(logits, score)``.

    What the exported files compute, so a deployment applies the card's rule to their second output without
    the project's code: ``score < threshold`` is "unlike the training images". ``knn`` keeps the bank of training
    features inside the graph (fp32, at most twice ``BANK_BYTES``).
    """

    def __init__(self, network: nn.Module, head: nn.Module, calibration: nn.Module) -> None:
        super().__init__()
        self.network, self.head = network, head
        self.score, self.multilabel = calibration.reject_with, calibration.multilabel
        self.register_buffer("bank", calibration.bank.float().clone())
        self.register_buffer("temperature", calibration.temperature.float().clone())
        self.k = neighbours(len(calibration.bank)) if len(calibration.bank) else 1

    def forward(self, images: Tensor) -> tuple[Tensor, Tensor]:
        seen: list[Tensor] = []
        hook = self.head.register_forward_pre_hook(lambda _module, args: seen.append(args[0]))
        try:
            logits = self.network(images)  # calibrated: the network divides by the temperature
        finally:
            hook.remove()
        if self.score == "knn":  # over several views (test-time augmentation), their features averaged, as predict
            features = torch.stack([view.flatten(1) for view in seen]).mean(0) if len(seen) > 1 else seen[0].flatten(1)
            return logits, knn_graph_scores(features, self.bank, self.k)
        return logits, logit_score(logits, self.temperature, self.score, self.multilabel)
