"""Probabilities that mean what they say, thresholds for multi-label answers, and an honest "unknown".

``Calibration`` is fitted on the validation split at the end of each validation of ``fit`` (so every
checkpoint carries the fit of its own weights) and saved in the checkpoint beside them:

- **Temperature scaling** (Guo et al., 2017): logits are divided by one number T (multi-label: one
  per class) chosen to minimize the validation negative log-likelihood. The ranking, and so top-1
  or mAP, is unchanged; the probabilities stop being over- (T > 1) or under-confident (T < 1).
- **Multi-label thresholds**: per class, the probability above which the label is given: the one
  that maximizes that class's F1 on the validation images, then all moved by one shift so that the labels
  given per validation image average the true count.
- **"Unknown"**, for two reasons: an image unlike the training images (the ``knn`` score on the features,
  ``models/domain.py``, or ``energy``/``msp`` on the logits; the threshold keeps ``keep_in_domain`` of all
  validation images), or, with one label per image, a likely mistake (the top calibrated probability below
  the threshold that keeps ``keep_correct`` of the correct validation answers).

pytorch-ood implements these scores and many more detectors; it is not used here because each score
is a few lines on what the model computes anyway, and pytorch-ood pins its own torch range. The expected
calibration error comes from torchmetrics (``CalibrationError``, 15 bins).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from torchmetrics.functional.classification import binary_calibration_error, multiclass_calibration_error

from .domain import DOMAIN_SCORES, DomainScore, keeping_threshold, knn_scores, logit_score, neighbours, normalized_bank

ECE_BINS = 15
# The weight, in validation images, of the pull of multi-label temperatures towards their common value.
# On 2x2 mosaics of real clothing photos (152 validation images, 3 seeds), free per-class temperatures
# raised the test log-loss once by 0.015 (a near-separable class got T = 0.26); pulled by 50 images, the
# test log-loss was the lowest of free, pulled and one shared temperature in each seed.
SHARED_TEMPERATURE_IMAGES = 50.0
CHECKPOINT_KEY = "calibration"
BANK_KEY = "domain_bank"  # the training features of the "knn" score: fp16, bounded (models/domain.py)


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


def count_matched_thresholds(probabilities: Tensor, targets: Tensor, thresholds: Tensor) -> Tensor:
    """``thresholds`` moved by one common shift in log-odds until the labels given per image average the true count.

    Per-class F1-best thresholds of a model of middling precision lean towards recall and give too many labels
    (on 2x2 mosaics of real photos: 5.9 given per image for 3.4 true); one shift keeps their order between the
    classes and fixes the total. The shift is found by bisection; counts move in steps, so the nearer side wins.
    """
    true_mean = float(targets.float().sum(1).mean())
    logit_p = torch.logit(probabilities.double().clamp(1e-7, 1 - 1e-7))
    logit_t = torch.logit(thresholds.double().clamp(1e-7, 1 - 1e-7))

    def given(shift: float) -> float:
        return float((logit_p >= logit_t + shift).sum(1).double().mean())

    low, high = -40.0, 40.0  # fewer labels as the shift grows
    for _ in range(80):
        middle = (low + high) / 2
        low, high = (middle, high) if given(middle) > true_mean else (low, middle)
    shift = low if abs(given(low) - true_mean) < abs(given(high) - true_mean) else high
    return torch.sigmoid(logit_t + shift).float()


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
        errors = [
            binary_calibration_error(probabilities[:, k].contiguous(), targets[:, k].long(), n_bins=ECE_BINS)
            for k in range(probabilities.shape[1])
        ]
        return float(torch.stack(errors).mean())
    return float(multiclass_calibration_error(probabilities, targets, probabilities.shape[1], n_bins=ECE_BINS))


class Calibration(nn.Module):
    """The fitted temperature, thresholds and the two reasons to answer "unknown" (buffers outside its state_dict).

    - **Unlike the training images** (``reject_with``, one label or several): a score of the image against the
      training images, ``knn`` on the penultimate features (``models/domain.py``) or ``energy``/``msp`` on the
      logits, with the threshold that keeps ``keep_in_domain`` of all validation images.
    - **A likely mistake** (one label per image): the top calibrated probability below the threshold that keeps
      ``keep_correct`` of the correct validation answers (1.0 turns it off).

    The buffers follow the model across devices; the checkpoint keeps them as ``record()`` under
    ``"calibration"`` and the bank of training features under ``"domain_bank"`` (a checkpoint without one, or a
    run that has not validated yet: T = 1, thresholds 0.5, every image answered). Outside the state_dict on
    purpose: code that walks a state_dict expects the network's tensors only.
    """

    def __init__(
        self,
        task: str,
        num_classes: int,
        reject_with: DomainScore = "knn",
        keep_correct: float = 0.95,
        keep_in_domain: float = 0.95,
    ) -> None:
        super().__init__()
        for name, share in (("keep_correct", keep_correct), ("keep_in_domain", keep_in_domain)):
            if not 0 < share <= 1:
                raise ValueError(f"model.{name} must be a share in (0, 1], got {share}")
        self.multilabel = task == "multilabel"
        self.reject_with = reject_with
        self.keep_correct, self.keep_in_domain = keep_correct, keep_in_domain
        temperatures = num_classes if self.multilabel else 1
        self.register_buffer("temperature", torch.ones(temperatures), persistent=False)
        self.register_buffer("thresholds", torch.full((num_classes,), 0.5), persistent=False)
        self.register_buffer("rejection", torch.tensor(-math.inf), persistent=False)  # the likely-mistake threshold
        self.register_buffer("domain_threshold", torch.tensor(-math.inf), persistent=False)
        # Not a buffer: its shape changes when it is fitted, which a weight-averaged copy's buffers cannot follow.
        self.bank = torch.zeros(0, 0, dtype=torch.float16)
        self.fitted: dict[str, Any] = {}  # what the last fit measured (the record's figures)
        self.fitted_split = "val"  # on which images: the validation split, or a cross-validation's out-of-fold
        self.by_score: dict[str, float] = {}  # the in-domain threshold of each score, fitted alike
        self.taken: dict[str, Any] | None = None  # the checkpoint record last restored: each is taken once
        self._logits: list[Tensor] = []
        self._targets: list[Tensor] = []
        self._features: list[Tensor] = []

    def probabilities(self, logits: Tensor) -> Tensor:
        """Calibrated probabilities: softmax (multi-label: sigmoid) of the logits over the temperature."""
        scaled = logits.float() / self.temperature
        return scaled.sigmoid() if self.multilabel else scaled.softmax(dim=-1)

    def scores(self, logits: Tensor, score: str = "msp") -> Tensor:
        """A logit score (higher: surer): ``msp``, the top calibrated probability (multi-label: the top
        sigmoid), or ``energy``, T x logsumexp(logits / T) (multi-label: JointEnergy, the sum of log(1 + e^x))."""
        return logit_score(logits.float() / self.temperature, self.temperature, score, self.multilabel)

    def domain_scores(self, logits: Tensor, features: Tensor | None, score: str | None = None) -> Tensor | None:
        """How like the training images each image is, by ``score`` (``reject_with`` by default); None where the
        score cannot be computed (``none``; ``knn`` without features or before a bank was fitted)."""
        score = score or self.reject_with
        if score == "none":
            return None
        if score == "knn":
            if features is None or not len(self.bank):
                return None
            if self.bank.device != features.device:  # moved once, where the features are
                self.bank = self.bank.to(features.device)
            return knn_scores(features, self.bank)
        return self.scores(logits, score)

    def in_domain(self, logits: Tensor, features: Tensor | None = None) -> Tensor:
        """True where an image is like the training images by ``reject_with`` (every image, where it cannot say)."""
        scores = self.domain_scores(logits, features)
        if scores is None:
            return torch.ones(len(logits), dtype=torch.bool, device=logits.device)
        return scores >= self.domain_threshold

    def answered(self, logits: Tensor, features: Tensor | None = None) -> Tensor:
        """Multi-class: True where an image gets a class, False where the answer is "unknown" (either reason)."""
        sure = self.scores(logits, "msp") >= self.rejection
        return sure & self.in_domain(logits, features)

    def given_labels(self, probabilities: Tensor) -> Tensor:
        """Multi-label: the (N, classes) 0/1 answer, each class at its threshold."""
        return probabilities >= self.thresholds

    def answers(self, logits: Tensor, features: Tensor | None = None) -> dict[str, Tensor]:
        """What ``predict`` writes of a batch: the calibrated probabilities; which images are like the training
        ones (``in_domain``) and, of one label, which get an answer (``answered``), or, of several, which labels
        each gets (``labels``, none for an image unlike the training ones); the domain score (``score``)."""
        probabilities = self.probabilities(logits)
        scores = self.domain_scores(logits, features)
        inside = self.in_domain(logits, features)
        answer = {"probabilities": probabilities, "in_domain": inside}
        if scores is not None:
            answer["score"] = scores
        if self.multilabel:
            return answer | {"labels": self.given_labels(probabilities) & inside[:, None]}
        return answer | {"answered": self.answered(logits, features)}

    def scaling(self) -> nn.Module:
        """A module dividing logits by the temperature (this buffer, shared), for the network that is exported.

        Shared rather than copied: a copy made under inference mode (test, predict) could not take part
        in the gradients a class-activation map needs.
        """
        return TemperatureScaling(self.temperature)

    # Fitting, on the images of one validation pass.
    def reset(self) -> None:
        self._logits, self._targets, self._features = [], [], []

    def collect(self, logits: Tensor, targets: Tensor, features: Tensor | None = None) -> None:
        self._logits.append(logits.detach().float().cpu())
        self._targets.append(targets.detach().cpu())
        if features is not None:
            self._features.append(features.detach().float().cpu())

    def fit(self, training_features: Tensor | None = None) -> dict[str, float]:
        """Fit on every rank's collected images (the same result on each); returns figures to log.

        ``training_features``: the features of (a seeded sample of) the training images, the bank of ``knn``.
        """
        if not self._logits:
            return {}
        logits, targets = torch.cat(self._logits), torch.cat(self._targets)
        features = torch.cat(self._features) if len(self._features) == len(self._logits) else None
        self.reset()
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            shares: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(shares, (logits, targets, features))
            logits, targets = torch.cat([s[0] for s in shares]), torch.cat([s[1] for s in shares])
            features = None if any(s[2] is None for s in shares) else torch.cat([s[2] for s in shares])
        if training_features is not None and len(training_features):
            self.bank = normalized_bank(training_features)
        knn = None
        if features is not None and len(self.bank):
            knn = knn_scores(features.to(self.temperature.device), self.bank.to(self.temperature.device)).cpu()
        return self.fit_answers(logits, targets, knn, split="val")

    def fit_answers(
        self, logits: Tensor, targets: Tensor, knn: Tensor | None, split: str, bank: Tensor | None = None
    ) -> dict[str, float]:
        """Fit on given answers: ``logits`` (uncalibrated) and ``knn`` scores of held-out images; figures to log.

        ``fit`` passes one validation's; a cross-validation's final model, which validates on nothing, the
        pooled out-of-fold answers of its folds' models (``split``: what the record says they were), with the
        bank of its own training features.
        """
        if bank is not None:
            self.bank = bank
        device = self.temperature.device
        logits = logits.float().to(device)
        if self.multilabel:
            targets = targets.float()
        plain = logits.softmax(-1) if not self.multilabel else logits.sigmoid()
        temperature = fit_temperature(logits.cpu(), targets, self.multilabel)
        self.temperature.copy_(temperature.to(device))
        calibrated = self.probabilities(logits).cpu()
        self.fitted_split = split
        self.fitted = {
            "images": len(logits),
            "ece_before": calibration_error(plain.cpu(), targets, self.multilabel),
            "ece_after": calibration_error(calibrated, targets, self.multilabel),
        }
        figures = {"ece": self.fitted["ece_after"], "ece_uncalibrated": self.fitted["ece_before"]}
        inside, domain_figures = self._fit_domain(logits, knn)
        figures |= domain_figures
        if self.multilabel:
            f1_best = best_f1_thresholds(calibrated, targets)
            self.thresholds.copy_(count_matched_thresholds(calibrated, targets, f1_best).to(device))
            given = self.given_labels(calibrated.to(device)).float().sum(1).mean()
            self.fitted |= {"labels_given": float(given), "labels_true": float(targets.sum(1).mean())}
            figures["labels_given"] = self.fitted["labels_given"]
            return figures
        correct = calibrated.argmax(-1) == targets
        sure = self.scores(logits, "msp").cpu()
        keep = self.keep_correct
        self.rejection.fill_(rejection_threshold(sure, correct, keep) if keep < 1 else -math.inf)
        answered = (sure >= self.rejection.cpu()) & inside
        self.fitted |= {
            "coverage": float(answered.float().mean()),  # answered for neither reason
            "kept_correct": float((sure >= self.rejection.cpu())[correct].float().mean()) if correct.any() else 1.0,
            "answered_accuracy": float(correct[answered].float().mean()) if answered.any() else 0.0,
        }
        figures["coverage"] = self.fitted["coverage"]
        return figures

    def _fit_domain(self, logits: Tensor, knn: Tensor | None) -> tuple[Tensor, dict[str, float]]:
        """Every score's in-domain threshold on these held-out images (so evaluation may switch scores); which of
        them are in the domain by ``reject_with``, and the share."""
        self.by_score = {}
        scores_of = {score: self.domain_scores(logits, None, score) for score in DOMAIN_SCORES if score != "knn"}
        scores_of["knn"] = knn
        for score, scores in scores_of.items():
            if scores is not None:
                self.by_score[score] = keeping_threshold(scores.cpu(), self.keep_in_domain)
        self.domain_threshold.fill_(self.by_score.get(self.reject_with, -math.inf))
        if self.reject_with != "none" and self.reject_with not in self.by_score:
            rank_zero_info(
                f'Calibration: no "{self.reject_with}" score could be fitted (the model gave no features, or '
                "the data no training images): no image is answered unknown as unlike the training ones"
            )
        chosen = scores_of.get(self.reject_with)
        inside = torch.ones(len(logits), dtype=torch.bool)
        if chosen is not None:
            inside = chosen.cpu() >= self.domain_threshold.cpu()
        self.fitted["in_domain"] = float(inside.float().mean())
        return inside, {"in_domain": self.fitted["in_domain"]}

    # The checkpoint.
    def save_to(self, checkpoint: dict[str, Any]) -> None:
        """Keep the record (plain numbers) and the bank of training features (one fp16 tensor) in ``checkpoint``."""
        checkpoint[CHECKPOINT_KEY] = self.record()
        if len(self.bank):
            checkpoint[BANK_KEY] = self.bank.cpu()

    def restore_from(self, checkpoint: dict[str, Any]) -> None:
        """Take back what ``save_to`` kept (a checkpoint of an earlier release may hold less, or nothing).

        Once per restore: a command's restore calls the model's ``on_load_checkpoint`` (which a user's
        ``load_from_checkpoint`` needs) and then the engine's guarantee, which takes it only if the model did not,
        and then forgets it (``taken``), so that a later restore of the same dict takes it again.
        """
        record = checkpoint.get(CHECKPOINT_KEY)
        if record is not None and record is self.taken:
            return
        self.taken = record
        self.restore(record, checkpoint.get(BANK_KEY))

    def record(self) -> dict[str, Any]:
        """What the checkpoint keeps (plain numbers: the model card and other runtimes read them)."""
        record: dict[str, Any] = {
            "task": "multilabel" if self.multilabel else "multiclass",
            "temperature": self.temperature.cpu().tolist(),
            "fitted_on": {"split": self.fitted_split, **self.fitted} if self.fitted else None,
        }
        if self.by_score:
            record["domain"] = {
                "score": self.reject_with,
                "threshold": float(self.domain_threshold),
                "keep_in_domain": self.keep_in_domain,
                "thresholds": dict(self.by_score),
                "bank_images": len(self.bank),
                "neighbours": neighbours(len(self.bank)) if len(self.bank) else None,
            }
        if self.multilabel:
            record["thresholds"] = self.thresholds.cpu().tolist()
            return record
        if self.keep_correct < 1:
            record["rejection"] = {
                "score": "msp",
                "threshold": float(self.rejection),
                "keep_correct": self.keep_correct,
            }
        return record

    def restore(self, record: dict[str, Any] | None, bank: Tensor | None = None) -> None:
        """Take a checkpoint's record and bank (None: a checkpoint of a release before them; nothing to take)."""
        if bank is not None:
            self.bank = bank.to(dtype=torch.float16)
        if not record:
            return
        self.temperature.copy_(torch.tensor(record["temperature"], dtype=torch.float32))
        if self.multilabel and record.get("thresholds") is not None:
            self.thresholds.copy_(torch.tensor(record["thresholds"], dtype=torch.float32))
        fitted_on = record.get("fitted_on") or {}
        self.fitted = {key: value for key, value in fitted_on.items() if key != "split"}
        self.fitted_split = fitted_on.get("split", "val")
        domain = record.get("domain") or {}
        self.by_score = {score: float(value) for score, value in (domain.get("thresholds") or {}).items()}
        kept = domain.get("keep_in_domain")
        if kept is not None and kept != self.keep_in_domain:
            rank_zero_info(
                f'Calibration: the checkpoint\'s "unknown" threshold keeps {kept} of the validation images, '
                f"as fitted; model.keep_in_domain {self.keep_in_domain} takes a fit"
            )
        if self.reject_with in self.by_score:
            self.domain_threshold.fill_(self.by_score[self.reject_with])
        elif self.reject_with != "none":
            self.domain_threshold.fill_(-math.inf)
        if self.reject_with not in self.by_score and self.reject_with != "none" and fitted_on:  # else: never fitted
            rank_zero_info(
                f'Calibration: the checkpoint has no "{self.reject_with}" threshold for images unlike the '
                "training ones (a run of a release before 1.4, or a model without features): fit again "
                "to fit one"
            )
        rejection = record.get("rejection")
        if not self.multilabel and rejection and rejection.get("score") == "msp" and self.keep_correct < 1:
            self.rejection.fill_(float(rejection["threshold"]))


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
        rows.append(
            (
                float(confidence[members].mean()) if count else float(edges[b] + edges[b + 1]) / 2,
                float(correct[members].mean()) if count else 0.0,
                count,
            )
        )
    return rows
