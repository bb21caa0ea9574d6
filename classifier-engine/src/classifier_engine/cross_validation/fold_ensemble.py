"""A cross-validation's fold models as one model (``cross_validate.py --final ensemble``): one graph of k networks.

Each fold model answers as it was calibrated on its own fold: its calibrated probabilities (softmax, or each
class's sigmoid, of its logits over its temperature) and, where it fitted one, its "unknown" score. The
ensemble's probabilities are the mean of the k models' (a deep ensemble's rule); its logits are the ones whose
softmax (sigmoid) gives them, log p (log p - log(1 - p)), computed stably. Its score is the mean of the k
margins, each model's score minus its own threshold, so that "unknown" is a score below 0 whatever each
model's scale. With several labels, a label is given where its mean probability reaches the mean of the
folds' thresholds.

The ensemble keeps the model contract where export reads it (``network()``, ``calibration``, the
preprocessing of the folds, which share one config), so ``export.py``'s machinery builds, checks, judges and
cards it as it does one model. It costs k forward passes per image; the card says so.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..export.contract import OUTPUT_NAME, SCORE_NAME, inference_module
from ..export.model_card import CROSS_VALIDATION_KEY, ENSEMBLE_KEY
from ..models.calibration import CHECKPOINT_KEY, Calibration
from ..models.domain import ScoredNetwork

MARGIN = "fold_margin"  # the ensemble's score, as the card names it


def mean_probability_logits(logits: Tensor, multilabel: bool) -> Tensor:
    """The logits (classes last) whose softmax (multi-label: sigmoid) is the mean over the first dimension of
    ``logits``' softmax (sigmoid): log-mean-exp of the log-probabilities, no probability rounded to 0 on the way."""
    members = math.log(logits.shape[0])
    if not multilabel:
        return torch.logsumexp(nn.functional.log_softmax(logits, dim=-1), dim=0) - members
    present = torch.logsumexp(nn.functional.logsigmoid(logits), dim=0) - members
    absent = torch.logsumexp(nn.functional.logsigmoid(-logits), dim=0) - members
    return present - absent


class EnsembleNetwork(nn.Module):
    """k networks' calibrated logits combined as their mean probabilities (``mean_probability_logits``)."""

    def __init__(self, networks: list[nn.Module], multilabel: bool) -> None:
        super().__init__()
        self.networks = nn.ModuleList(networks)
        self.multilabel = multilabel

    def forward(self, images: Tensor) -> Tensor:
        return mean_probability_logits(torch.stack([network(images) for network in self.networks]), self.multilabel)


class ScoredEnsemble(nn.Module):
    """``(logits, score)``: the mean probabilities' logits, and the mean of each model's score minus its threshold."""

    output_names = (OUTPUT_NAME, SCORE_NAME)

    def __init__(self, members: list[ScoredNetwork], thresholds: list[float], multilabel: bool) -> None:
        super().__init__()
        self.members = nn.ModuleList(members)
        self.multilabel = multilabel
        self.register_buffer("thresholds", torch.tensor(thresholds, dtype=torch.float32))

    def forward(self, images: Tensor) -> tuple[Tensor, Tensor]:
        answers = [member(images) for member in self.members]
        logits = mean_probability_logits(torch.stack([answer[0] for answer in answers]), self.multilabel)
        margins = torch.stack([answer[1] for answer in answers]) - self.thresholds[:, None]
        return logits, margins.mean(0)


class FoldEnsemble(nn.Module):
    """The fold models, loaded and calibrated, as one model that export reads through the contract."""

    def __init__(self, members: list[Any]) -> None:
        super().__init__()
        first = members[0]
        self.members = nn.ModuleList(members)
        self.class_names, self.image_size, self.multilabel = list(first.class_names), first.image_size, first.multilabel
        self.normalize, self.backbone = first.normalize, first.backbone
        self.test_time_augmentation = first.test_time_augmentation
        calibration = first.calibration
        task = "multilabel" if self.multilabel else "multiclass"
        # Each member's logits come calibrated: the ensemble's temperature is 1.
        self.calibration = Calibration(
            task, len(self.class_names), calibration.reject_with, 1.0, calibration.keep_in_domain
        )
        if self.multilabel:
            self.calibration.thresholds.copy_(torch.stack([m.calibration.thresholds for m in members]).mean(0))
        self.scored = all(isinstance(inference_module(member), ScoredNetwork) for member in members)
        if self.scored:  # the margin's threshold: 0
            self.calibration.domain_threshold.fill_(0.0)

    def network(self) -> nn.Module:
        return EnsembleNetwork([member.network() for member in self.members], self.multilabel)

    def inference_module(self) -> nn.Module:
        """What the exported files compute: the mean probabilities' logits and, where every fold has one, the margin."""
        if not self.scored:
            return self.network()
        thresholds = [float(member.calibration.domain_threshold) for member in self.members]
        return ScoredEnsemble([inference_module(member) for member in self.members], thresholds, self.multilabel)

    def evaluate(self, images: Tensor, all_views: bool = True) -> Tensor:
        calibrated = [member.evaluate(images, all_views) / member.calibration.temperature for member in self.members]
        return mean_probability_logits(torch.stack(calibrated), self.multilabel)

    def features(self, images: Tensor) -> Tensor:
        """The members' L2-normalized features side by side."""
        return torch.cat([nn.functional.normalize(member.features(images), dim=1) for member in self.members], 1)

    def calibration_record(self) -> dict[str, Any]:
        """The card's calibration: each fold's own, combined as above."""
        record: dict[str, Any] = {
            "task": "multilabel" if self.multilabel else "multiclass",
            "temperature": [1.0],
            "members_temperature": [member.calibration.temperature.tolist() for member in self.members],
            "fitted_on": {"split": "out-of-fold"},
        }
        if self.scored:
            keep = self.calibration.keep_in_domain
            record["domain"] = {
                "score": MARGIN,
                "threshold": 0.0,
                "keep_in_domain": keep,
                "thresholds": {MARGIN: 0.0},
                "bank_images": None,
                "neighbours": len(self.members),
            }
        if self.multilabel:
            record["thresholds"] = self.calibration.thresholds.tolist()
        return record


def ensemble_checkpoint(
    first: dict[str, Any], ensemble: FoldEnsemble, figures: dict[str, Any], sources: list[dict[str, str]]
) -> dict[str, Any]:
    """What the card reads of an ensemble: the first fold's run (config, preprocessing; the folds share them) with
    the ensemble's calibration and the cross-validated figures."""
    return {key: value for key, value in first.items() if key not in ("state_dict", "optimizer_states")} | {
        CHECKPOINT_KEY: ensemble.calibration_record(),
        CROSS_VALIDATION_KEY: figures,
        ENSEMBLE_KEY: sources,
    }


def member_sources(checkpoints: list[Path]) -> list[dict[str, str]]:
    """Each fold model's checkpoint, relative to its run's folder's parent, and its SHA-256, for the card."""
    from ..foundation.files import sha256

    return [
        {"checkpoint": f"{path.parent.parent.name}/{path.parent.name}/{path.name}", "sha256": sha256(path)}
        for path in checkpoints
    ]
