"""Probabilities that mean what they say, thresholds for multi-label answers, and an honest "unknown".

``Calibration`` is fitted on the validation split at the end of each validation of ``fit`` (so every
checkpoint carries the fit of its own weights) and saved in the checkpoint beside them:

- **Temperature scaling** (Guo et al., 2017): logits are divided by one number T (multi-label: one
  per class) chosen to minimize the validation negative log-likelihood. The ranking, and so top-1
  or mAP, is unchanged; the probabilities stop being over- (T > 1) or under-confident (T < 1).
- **Multi-label thresholds**: per class, the probability above which the label is given, the one
  that maximizes that class's F1 on the validation images.
- **Rejection** (multi-class): a score per image, the maximum softmax probability (``msp``) or the
  negative energy T x logsumexp(logits / T) (``energy``, Liu et al., 2020), and the threshold below
  which the answer is "unknown": the one that keeps ``keep_correct`` of the correct validation answers.

pytorch-ood implements these scores and many more detectors; it is not used here because the two
scores need a line each on the logits the model already computes, and pytorch-ood pins its own
torch range. The expected calibration error comes from torchmetrics (``CalibrationError``, 15 bins).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import torch
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from torchmetrics.functional.classification import binary_calibration_error, multiclass_calibration_error

RejectionScore = Literal["msp", "energy", "none"]
ECE_BINS = 15
# The weight, in validation images, of the pull of multi-label temperatures towards their common value.
# On 2x2 mosaics of real clothing photos (152 validation images, 3 seeds), free per-class temperatures
# raised the test log-loss once by 0.015 (a near-separable class got T = 0.26); pulled by 50 images, the
# test log-loss was the lowest of free, pulled and one shared temperature in each seed.
SHARED_TEMPERATURE_IMAGES = 50.0
CHECKPOINT_KEY = "calibration"


def fit_temperature(logits: Tensor, targets: Tensor, multilabel: bool) -> Tensor:
    """The temperature(s) minimizing the negative log-likelihood of ``targets`` (one per class for multi-label).

    Multi-label temperatures are drawn towards their common value as by ``SHARED_TEMPERATURE_IMAGES``
    images: alone, a class the validation images almost separate drives its T towards 0 and over-fits.
    """
    logits = logits.double()
    log_t = torch.zeros(logits.shape[1] if multilabel else 1, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([log_t], lr=0.1, max_iter=200, line_search_fn="strong_wolfe")
    pull = SHARED_TEMPERATURE_IMAGES / max(len(logits), 1)

    def nll() -> Tensor:
        optimizer.zero_grad()
        scaled = logits / log_t.exp()
        if multilabel:
            loss = nn.functional.binary_cross_entropy_with_logits(scaled, targets.double())
            loss = loss + pull * ((log_t - log_t.mean()) ** 2).mean()
        else:
            loss = nn.functional.cross_entropy(scaled, targets)
        loss.backward()
        return loss

    optimizer.step(nll)
    return log_t.detach().clamp(-4, 4).exp().float()  # T within [0.018, 55]: a degenerate split stays finite


def best_f1_thresholds(probabilities: Tensor, targets: Tensor) -> Tensor:
    """Per class, the probability threshold (``p >= t`` gives the label) with the best F1 on these images.

    The threshold lies halfway between the last probability given the label and the next one down,
    so a runtime that computes the probabilities a hair differently answers the same.
    """
    thresholds = torch.full((probabilities.shape[1],), 0.5)
    for k in range(probabilities.shape[1]):
        p, y = probabilities[:, k].double(), targets[:, k].double()
        positives = y.sum()
        if positives == 0:
            continue
        order = torch.argsort(p, descending=True)
        p, y = p[order], y[order]
        true_positives = torch.cumsum(y, 0)
        given = torch.arange(1, len(p) + 1, dtype=torch.float64)
        f1 = 2 * true_positives / (given + positives)
        last = torch.cat([p[1:] < p[:-1], torch.ones(1, dtype=torch.bool)])  # cut only between distinct values
        best = int(torch.where(last, f1, torch.full_like(f1, -1)).argmax())
        below = float(p[best + 1]) if best + 1 < len(p) else 0.0
        thresholds[k] = (float(p[best]) + below) / 2
    return thresholds


def rejection_threshold(scores: Tensor, correct: Tensor, keep_correct: float) -> float:
    """The score threshold (``score >= t`` answers) that keeps ``keep_correct`` of the correct answers."""
    kept = torch.sort(scores[correct].double()).values
    if not len(kept):
        return -math.inf
    drop = math.floor(round((1 - keep_correct) * len(kept), 9))
    if drop == 0:
        return -math.inf if keep_correct >= 1 else float(kept[0]) - 1e-6
    return (float(kept[drop - 1]) + float(kept[drop])) / 2


def calibration_error(probabilities: Tensor, targets: Tensor, multilabel: bool) -> float:
    """Expected calibration error (15 bins; multi-label: per class, averaged over the classes)."""
    if multilabel:
        errors = [binary_calibration_error(probabilities[:, k].contiguous(), targets[:, k].long(), n_bins=ECE_BINS)
                  for k in range(probabilities.shape[1])]  # fmt: skip
        return float(torch.stack(errors).mean())
    return float(multiclass_calibration_error(probabilities, targets, probabilities.shape[1], n_bins=ECE_BINS))


class Calibration(nn.Module):
    """The fitted temperature, thresholds and rejection of a classifier (buffers outside its state_dict).

    The buffers follow the model across devices; the checkpoint keeps them as ``record()`` under
    ``"calibration"`` (a checkpoint without one, or a run that has not validated yet: T = 1,
    thresholds 0.5, no rejection). Outside the state_dict on purpose: code that walks a state_dict
    expects tensors only.
    """

    def __init__(
        self, task: str, num_classes: int, reject_with: RejectionScore = "msp", keep_correct: float = 0.95
    ) -> None:
        super().__init__()
        if not 0 < keep_correct <= 1:
            raise ValueError(f"model.keep_correct must be a share in (0, 1], got {keep_correct}")
        self.multilabel = task == "multilabel"
        self.reject_with = "none" if self.multilabel else reject_with
        self.keep_correct = keep_correct
        temperatures = num_classes if self.multilabel else 1
        self.register_buffer("temperature", torch.ones(temperatures), persistent=False)
        self.register_buffer("thresholds", torch.full((num_classes,), 0.5), persistent=False)
        self.register_buffer("rejection", torch.tensor(-math.inf), persistent=False)
        self.fitted: dict[str, Any] = {}  # what the last fit measured (the record's figures)
        self.by_score: dict[str, float] = {}  # multi-class: the "unknown" threshold of each score, fitted alike
        self._logits: list[Tensor] = []
        self._targets: list[Tensor] = []

    def probabilities(self, logits: Tensor) -> Tensor:
        """Calibrated probabilities: softmax (multi-label: sigmoid) of the logits over the temperature."""
        scaled = logits.float() / self.temperature
        return scaled.sigmoid() if self.multilabel else scaled.softmax(dim=-1)

    def scores(self, logits: Tensor, score: RejectionScore | None = None) -> Tensor:
        """How sure each answer is, by the rejection score (higher: more like the validation images)."""
        scaled = logits.float() / self.temperature
        if (score or self.reject_with) == "energy":
            return self.temperature * torch.logsumexp(scaled, dim=-1)
        return scaled.softmax(dim=-1).max(dim=-1).values

    def answered(self, logits: Tensor) -> Tensor:
        """Multi-class: True where an image gets a class, False where the answer is "unknown"."""
        if self.reject_with == "none":
            return torch.ones(len(logits), dtype=torch.bool, device=logits.device)
        return self.scores(logits) >= self.rejection

    def given_labels(self, probabilities: Tensor) -> Tensor:
        """Multi-label: the (N, classes) 0/1 answer, each class at its threshold."""
        return probabilities >= self.thresholds

    def answers(self, logits: Tensor) -> dict[str, Tensor]:
        """What ``predict`` writes of a batch: the calibrated probabilities, and which images get an answer
        (``answered``; multi-label: which labels each gets, ``labels``)."""
        probabilities = self.probabilities(logits)
        if self.multilabel:
            return {"probabilities": probabilities, "labels": self.given_labels(probabilities)}
        return {"probabilities": probabilities, "answered": self.answered(logits)}

    def scaling(self) -> nn.Module:
        """A module dividing logits by the temperature (this buffer, shared), for the network that is exported.

        Shared rather than copied: a copy made under inference mode (test, predict) could not take part
        in the gradients a class-activation map needs.
        """
        return TemperatureScaling(self.temperature)

    # Fitting, on the images of one validation pass.
    def reset(self) -> None:
        self._logits, self._targets = [], []

    def collect(self, logits: Tensor, targets: Tensor) -> None:
        self._logits.append(logits.detach().float().cpu())
        self._targets.append(targets.detach().cpu())

    def fit(self) -> dict[str, float]:
        """Fit on every rank's collected images (the same result on each); returns figures to log."""
        if not self._logits:
            return {}
        logits, targets = torch.cat(self._logits), torch.cat(self._targets)
        self.reset()
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            shares: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(shares, (logits, targets))
            logits, targets = torch.cat([s[0] for s in shares]), torch.cat([s[1] for s in shares])
        device = self.temperature.device
        if self.multilabel:
            targets = targets.float()
        plain = logits.softmax(-1) if not self.multilabel else logits.sigmoid()
        temperature = fit_temperature(logits, targets, self.multilabel)
        self.temperature.copy_(temperature.to(device))
        calibrated = self.probabilities(logits.to(device)).cpu()
        self.fitted = {
            "images": len(logits),
            "ece_before": calibration_error(plain, targets, self.multilabel),
            "ece_after": calibration_error(calibrated, targets, self.multilabel),
        }
        figures = {"ece": self.fitted["ece_after"], "ece_uncalibrated": self.fitted["ece_before"]}
        if self.multilabel:
            self.thresholds.copy_(best_f1_thresholds(calibrated, targets).to(device))
            return figures
        # Both scores' thresholds are kept, so test and predict may switch model.reject_with on this checkpoint.
        correct = calibrated.argmax(-1) == targets
        by_score = {score: self.scores(logits.to(device), score).cpu() for score in ("msp", "energy")}
        self.by_score = {
            score: rejection_threshold(scores, correct, self.keep_correct) for score, scores in by_score.items()
        }
        if self.reject_with != "none":
            scores = by_score[self.reject_with]
            threshold = self.by_score[self.reject_with]
            self.rejection.fill_(threshold)
            answered = scores >= threshold
            self.fitted |= {
                "coverage": float(answered.float().mean()),
                "kept_correct": float(answered[correct].float().mean()) if correct.any() else 1.0,
                "answered_accuracy": float(correct[answered].float().mean()) if answered.any() else 0.0,
            }
            figures["coverage"] = self.fitted["coverage"]
        return figures

    # The checkpoint's record.
    def record(self) -> dict[str, Any]:
        """What the checkpoint keeps (plain numbers: the model card and other runtimes read them)."""
        record: dict[str, Any] = {
            "task": "multilabel" if self.multilabel else "multiclass",
            "temperature": self.temperature.cpu().tolist(),
            "fitted_on": {"split": "val", **self.fitted} if self.fitted else None,
        }
        if self.multilabel:
            record["thresholds"] = self.thresholds.cpu().tolist()
            return record
        if self.by_score:
            record["unknown_thresholds"] = {**self.by_score, "keep_correct": self.keep_correct}
        if self.reject_with != "none":
            record["rejection"] = {
                "score": self.reject_with,
                "threshold": float(self.rejection),
                "keep_correct": self.keep_correct,
            }
        return record

    def restore(self, record: dict[str, Any] | None) -> None:
        """Take a checkpoint's record (None: a checkpoint of a release before calibration; nothing to take)."""
        if not record:
            return
        self.temperature.copy_(torch.tensor(record["temperature"], dtype=torch.float32))
        if self.multilabel and record.get("thresholds") is not None:
            self.thresholds.copy_(torch.tensor(record["thresholds"], dtype=torch.float32))
        self.fitted = {key: value for key, value in (record.get("fitted_on") or {}).items() if key != "split"}
        if self.multilabel or self.reject_with == "none":
            return
        by_score, rejection = record.get("unknown_thresholds") or {}, record.get("rejection")
        self.by_score = {score: float(by_score[score]) for score in ("msp", "energy") if score in by_score}
        kept = by_score.get("keep_correct", (rejection or {}).get("keep_correct"))
        if kept is not None and kept != self.keep_correct:
            rank_zero_info(
                f'Calibration: the checkpoint\'s "unknown" threshold keeps {kept} of the correct validation answers, '
                f"as fitted; model.keep_correct {self.keep_correct} takes a fit"
            )
        if self.reject_with in self.by_score:
            self.rejection.fill_(self.by_score[self.reject_with])
        elif rejection and rejection["score"] == self.reject_with:
            self.rejection.fill_(float(rejection["threshold"]))
        else:  # a record that kept one score's threshold says nothing of the other score
            rank_zero_info(
                f'Calibration: the checkpoint has no "unknown" threshold for model.reject_with {self.reject_with}: '
                "every image gets a class (fit again to fit one)"
            )


class TemperatureScaling(nn.Module):
    """Logits over the fitted temperature: the exported files output calibrated logits."""

    def __init__(self, temperature: Tensor) -> None:
        super().__init__()
        self.register_buffer("temperature", temperature)

    def forward(self, logits: Tensor) -> Tensor:
        return logits / self.temperature


def reliability(confidence: np.ndarray, correct: np.ndarray, bins: int = ECE_BINS) -> list[tuple[float, float, int]]:
    """Per confidence bin (equal widths over [0, 1]): (mean confidence, accuracy, images); the diagram's bars."""
    edges = np.linspace(0, 1, bins + 1)
    which = np.clip(np.digitize(confidence, edges[1:-1], right=True), 0, bins - 1)
    rows = []
    for b in range(bins):
        members = which == b
        count = int(members.sum())
        rows.append((float(confidence[members].mean()) if count else float(edges[b] + edges[b + 1]) / 2,
                     float(correct[members].mean()) if count else 0.0, count))  # fmt: skip
    return rows
