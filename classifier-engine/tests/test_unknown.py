""" "Unknown" for images unlike the training ones: the kNN score against its published formula, the thresholds,
label sets of the right size, and a real ``predict`` that says unknown for images of another kind.
"""

from __future__ import annotations

import csv
import math
import shutil
import traceback
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from classifier_engine import Calibration
from classifier_engine.cli.model_guarantees import CalibrationFit
from classifier_engine.models.calibration import best_f1_thresholds, count_matched_thresholds
from classifier_engine.models.domain import bank_capacity, keeping_threshold, knn_scores, neighbours, normalized_bank
from classifier_engine.testing.reference import ReferenceClassifier

from .conftest import only_run_dir, reference, write_image_folder


def test_the_knn_score_is_minus_the_distance_to_the_k_th_nearest_normalized_training_feature():
    """Sun et al. (ICML 2022): z = f / ||f||; score = -||z - z_(k)||, z_(k) the k-th nearest normalized training
    feature; here computed by brute force with ``torch.cdist`` and a sort, against the chunked product."""
    generator = torch.Generator().manual_seed(0)
    training, queries = torch.randn(300, 16, generator=generator), torch.randn(70, 16, generator=generator) * 3
    bank = normalized_bank(training)
    for k in (1, 5, 50):
        distances = torch.cdist(torch.nn.functional.normalize(queries, dim=1), bank.float())
        expected = -distances.sort(dim=1).values[:, k - 1]
        assert torch.allclose(knn_scores(queries, bank, k, chunk=16), expected, atol=1e-3)  # an fp16 bank
    assert knn_scores(training[:3], bank, 1).abs().max() < 2e-2  # a training image is its own nearest (fp16 bank)


def test_the_bank_is_bounded_and_k_follows_the_share_of_the_training_images_kept():
    assert bank_capacity(1280) == 5000 and bank_capacity(4096) == 20 * 2**20 // (2 * 4096)
    assert bank_capacity(4096) * 4096 * 2 <= 20 * 2**20  # at most 20 MiB of fp16
    assert [neighbours(n) for n in (1, 3, 245, 5000, 20_000, 1_000_000)] == [1, 3, 5, 5, 20, 1000]


def test_a_checkpoint_s_calibration_is_taken_once_by_the_model_s_hook_and_the_engine_s(caplog):
    """A command calls the model's ``on_load_checkpoint`` and then the engine's: the second takes nothing again
    (no second line), while a different checkpoint is taken."""
    fitted = Calibration("multiclass", 3, "energy", 0.95, keep_in_domain=0.9)
    fitted.temperature.fill_(2.0)
    fitted.by_score, fitted.fitted = {"energy": -1.5}, {"images": 10}
    first, second = {}, {}
    fitted.save_to(first)
    fitted.temperature.fill_(3.0)
    fitted.save_to(second)
    restored = Calibration("multiclass", 3, "energy", 0.95, keep_in_domain=0.8)  # a changed setting: one line
    with caplog.at_level("INFO"):
        restored.restore_from(first)
        restored.temperature.fill_(7.0)  # what a second restore of the same checkpoint would undo
        restored.restore_from(first)
    assert restored.temperature.item() == 7.0
    assert sum("keeps 0.9 of the validation images" in line for line in caplog.messages) == 1
    restored.restore_from(second)
    assert restored.temperature.item() == 3.0 and restored.domain_threshold.item() == -1.5
    # The engine's hook ends a restore: a later restore of the same (cached) dict takes it again.
    restored.restore_from(first)
    restored.temperature.fill_(7.0)
    CalibrationFit().on_load_checkpoint(None, SimpleNamespace(calibration=restored), first)
    assert restored.temperature.item() == 7.0 and restored.taken is None
    restored.restore_from(first)
    assert restored.temperature.item() == 2.0


def test_the_in_domain_threshold_keeps_the_stated_share_of_all_validation_images():
    scores = torch.linspace(-1, 0, 200)
    for keep in (0.5, 0.9, 0.95, 0.99):
        assert float((scores >= keeping_threshold(scores, keep)).float().mean()) == pytest.approx(keep)
    assert keeping_threshold(scores, 1.0) == -math.inf


def test_label_sets_given_average_the_true_count_where_f1_best_thresholds_give_too_many():
    """A middling multi-label model: F1-best thresholds give far more labels than the images have; moved
    together, they give the true mean count (within one label in a hundred images)."""
    rng = np.random.default_rng(0)
    targets = torch.from_numpy(rng.random((400, 12)) < 0.25).float()
    noisy = torch.from_numpy(rng.normal(0, 2.5, (400, 12))).float()
    probabilities = torch.sigmoid(2 * targets - 1 + noisy)
    f1_best = best_f1_thresholds(probabilities, targets)
    true_mean = float(targets.sum(1).mean())
    assert float((probabilities >= f1_best).sum(1).float().mean()) > 1.3 * true_mean  # the problem
    matched = count_matched_thresholds(probabilities, targets, f1_best)
    assert abs(float((probabilities >= matched).sum(1).float().mean()) - true_mean) < 0.01
    order = lambda t: torch.argsort(torch.logit(t))  # noqa: E731 (the classes keep their order)
    assert torch.equal(order(matched), order(f1_best))


def test_an_image_unlike_the_training_ones_gets_no_labels_and_the_answers_say_why():
    calibration = Calibration("multilabel", 3, "knn", keep_in_domain=0.9)
    generator = torch.Generator().manual_seed(1)
    training = torch.randn(100, 8, generator=generator) + torch.tensor([5.0] + [0.0] * 7)
    validation = torch.randn(50, 8, generator=generator) + torch.tensor([5.0] + [0.0] * 7)
    logits = torch.randn(50, 3, generator=generator) * 3
    calibration.collect(logits, (logits > 0).long(), validation)
    figures = calibration.fit(training)
    assert figures["in_domain"] == pytest.approx(0.9) and calibration.fitted["labels_given"] > 0
    odd = -training[:4]  # the opposite direction: as far from every training feature as can be
    answer = calibration.answers(torch.full((4, 3), 5.0), odd)
    assert not answer["in_domain"].any() and not answer["labels"].any()
    checkpoint: dict = {}
    calibration.save_to(checkpoint)
    restored = Calibration("multilabel", 3, "knn", keep_in_domain=0.9)
    restored.restore_from(checkpoint)
    assert torch.equal(restored.bank, calibration.bank) and restored.record() == calibration.record()


def write_patterns(folder, count: int = 12) -> None:
    """Images of another kind than the training photos: grey stripes and checkerboards of several periods."""
    folder.mkdir(parents=True)
    for index in range(count):
        period = 2 + index % 6
        grid = (np.indices((64, 64)) // period).sum(0) % 2 if index % 2 else (np.arange(64) // period % 2)[None]
        pixels = np.broadcast_to(grid * 255, (64, 64)).astype(np.uint8)
        Image.fromarray(pixels).convert("RGB").save(folder / f"pattern{index:02d}.png")


def predictions_of(project, predict_dir: str) -> list[dict[str, str]]:
    """``predict`` of the trained run on ``predict_dir``, as the user types it; the rows of its CSV."""
    run_dir = only_run_dir(project)
    reference("predict", "--config", str(run_dir / "config.yaml"), "--ckpt_path=last",
              f"--data.predict_dir={predict_dir}", cwd=project)  # fmt: skip
    newest = max(run_dir.glob("predict/*/predictions.csv"), key=lambda path: path.stat().st_mtime_ns)
    return list(csv.DictReader(newest.read_text().splitlines()))


def test_predict_answers_unknown_for_images_of_another_kind_and_answers_images_like_the_training_ones(
    trained, tmp_path
):
    project = tmp_path / "project"
    shutil.copytree(trained, project, symlinks=True)
    write_patterns(project / "patterns")
    rows = predictions_of(project, "patterns")
    unlike = [row for row in rows if row["unknown_because"] == "unlike the training images"]
    assert len(rows) == 12 and len(unlike) >= 11 and all(row["predicted"] == "unknown" for row in unlike)
    rows = predictions_of(project, "photos")  # the training and validation photos themselves
    assert len(rows) == 72 and sum(row["unknown_because"] != "unlike the training images" for row in rows) >= 65


def test_the_bank_holds_the_features_of_the_weights_the_checkpoint_keeps_under_a_weight_average(tmp_path):
    """A weight average is swapped in for validation and out at its end: the bank is made while it is in, so
    every training image is at distance 0 from itself in the checkpoint's bank."""
    write_image_folder(tmp_path / "photos", per_class=12)
    reference("fit", "--data.image_dir=photos", "--trainer.max_epochs=2",
              "--trainer.callbacks+=lightning.pytorch.callbacks.WeightAveraging", cwd=tmp_path)  # fmt: skip
    last = only_run_dir(tmp_path) / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    model = ReferenceClassifier.load_from_checkpoint(last, map_location="cpu", weights_only=True).eval()
    model.calibration.restore_from(checkpoint)
    photos = sorted((tmp_path / "photos").rglob("*.*"))
    images = np.stack(
        [np.asarray(Image.open(path).convert("RGB").resize((32, 32))).transpose(2, 0, 1) for path in photos]
    )
    with torch.no_grad():
        features = model.features(torch.from_numpy(images))
    nearest = knn_scores(features, model.calibration.bank, 1).abs()
    assert len(model.calibration.bank) == 27 and int((nearest < 0.02).sum()) >= 25  # the training images' own rows


def test_validation_features_are_the_head_input_of_the_validation_pass_itself(tmp_path):
    """CalibrationFit takes the validation features from the step's own forward pass (a hook on the head), and
    they equal what ``features()`` computes of the same images with the same weights."""
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from classifier_engine.cli.model_guarantees import CalibrationFit

    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (24, 3, 32, 32), dtype=torch.uint8, generator=generator)
    labels = torch.arange(24) % 3
    loader = DataLoader(TensorDataset(images, labels), batch_size=8)
    model = ReferenceClassifier(num_classes=3)
    collected: list[torch.Tensor] = []
    collect = model.calibration.collect
    model.calibration.collect = lambda logits, labels, features: (
        collected.append(features) or collect(logits, labels, features)
    )
    callers: list[list[str]] = []  # who called the head, each time
    model.backbone[-1].register_forward_pre_hook(
        lambda _module, _args: callers.append([frame.name for frame in traceback.extract_stack()])
    )
    calibration_fit = CalibrationFit()
    trainer = L.Trainer(max_epochs=1, callbacks=[calibration_fit], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, num_sanity_val_steps=0, default_root_dir=tmp_path)  # fmt: skip
    trainer.fit(model, loader, loader)
    model.eval()
    with torch.no_grad():
        expected = model.features(images)
    assert len(collected) == 3 and torch.allclose(torch.cat(collected), expected, atol=1e-5)
    in_validation = [names for names in callers if "validation_step" in names or "on_validation_batch_end" in names]
    assert len(in_validation) == 3 and not any("on_validation_batch_end" in names for names in in_validation)
    assert not calibration_fit.seen and calibration_fit.hook is None  # unhooked once the fit ends
