"""Labels as people have them: several per image, classes of very different sizes, "unknown", calibrated probabilities.

Each through the commands a user types (fit, test, predict, export --register) on generated data:
a multi-label CSV of photos with a patch of each label's colour, a 10:1 imbalanced set whose two
classes overlap, and a deliberately over-confident model whose probabilities temperature scaling mends.
"""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch
from photo_classifier.models import ImageClassifier as PhotoClassifier
from PIL import Image
from sklearn.metrics import average_precision_score
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from classifier_engine.data.augment import BatchAugment
from classifier_engine.data.datamodule import balanced_weights
from classifier_engine.data.errors import DataSettingError
from classifier_engine.data.folder import ImageFolderDataModule, stratified_split
from classifier_engine.data.image_sources import find_images
from classifier_engine.data.loader import BalancedEpochSampler
from classifier_engine.models import calibration
from classifier_engine.models.calibration import Calibration, best_f1_thresholds, fit_temperature, rejection_threshold
from classifier_engine.testing import write_multilabel_images

from .conftest import PHOTO_ROOT, cli_env, images_args, only_run_dir, run_cli, run_data_of

CLASSES = ["blue", "green", "red", "yellow"]  # write_multilabel_images' labels, sorted


# --- multi-label: the CSV forms, and what is refused -------------------------------------------------------------


def test_a_tags_csv_and_a_one_hot_csv_give_the_same_multilabel_images(tmp_path):
    tags = write_multilabel_images(tmp_path / "tags", count=24)
    one_hot = write_multilabel_images(tmp_path / "one_hot", count=24, one_hot=True)
    found, same = find_images(tags), find_images(one_hot)
    assert found.task == same.task == "multilabel"
    assert found.class_names == CLASSES and set(same.class_names) == set(CLASSES)
    by_name = [[same.class_names[k] for k in entry.label] for entry in same.splits["train"]]
    assert [sorted(found.class_names[k] for k in entry.label) for entry in found.splits["train"]] == [
        sorted(names) for names in by_name
    ]
    assert any(len(entry.label) > 1 for entry in found.splits["train"])
    assert any(len(entry.label) == 0 for entry in found.splits["train"])  # an image of none of the labels
    counts = np.sum([[k in entry.label for k in range(4)] for entry in found.splits["train"]], axis=0)
    assert found.class_counts("train") == counts.tolist()


def write_photos(folder: Path, names: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        Image.new("RGB", (8, 8)).save(folder / name)


def labels_by_image(found) -> dict[str, list[str]]:
    return {
        entry.key: sorted(found.class_names[k] for k in (entry.label if found.task == "multilabel" else [entry.label]))
        for entry in found.splits["train"]
    }


def test_kaggle_s_planet_list_beside_its_image_folder_is_read_with_its_names_as_written(tmp_path, caplog):
    write_photos(tmp_path / "train-jpg", ["train_0.jpg", "train_1.jpg", "train_2.jpg", "train_3.jpg"])
    rows = ["image_name,tags", "train_0,haze primary", "train_1,agriculture clear primary water",
            "train_2,clear primary", "train_3,haze primary water"]  # fmt: skip
    (tmp_path / "train_classes.csv").write_text("\n".join(rows) + "\n")
    with caplog.at_level("INFO"):
        found = find_images(tmp_path / "train_classes.csv")
    assert found.task == "multilabel" and found.class_names == ["agriculture", "clear", "haze", "primary", "water"]
    assert labels_by_image(found)["train-jpg/train_1.jpg"] == ["agriculture", "clear", "primary", "water"]
    assert "train_classes.csv names images in train-jpg/" in caplog.text
    assert "gives rows with several labels: data.task is multilabel" in caplog.text


@pytest.mark.parametrize(
    ("rows", "task", "expected"),
    [
        # Without a header naming the column, class names with spaces stay whole: more words than names,
        # and no name is made of names.
        (
            ["a.png,golden retriever", "b.png,labrador retriever", "c.png,beagle"],
            "multiclass",
            {"a.png": ["golden retriever"], "b.png": ["labrador retriever"], "c.png": ["beagle"]},
        ),
        # ... and under a header that names one label per cell.
        (
            ["path,label", "a.png,golden retriever", "b.png,beagle cross", "c.png,beagle"],
            "multiclass",
            {"a.png": ["golden retriever"], "b.png": ["beagle cross"], "c.png": ["beagle"]},
        ),
        # A few images, most with one label: "cat dog" is made of labels that stand alone.
        (
            ["a.png,cat dog", "b.png,cat", "c.png,dog"],
            "multilabel",
            {"a.png": ["cat", "dog"], "b.png": ["cat"], "c.png": ["dog"]},
        ),
        # Labels separated by | (MovieLens' genres) keep their spaces.
        (
            ["file_name,categories", "a.png,Film Noir|Drama", "b.png,Drama", "c.png,Film Noir"],
            "multilabel",
            {"a.png": ["Drama", "Film Noir"], "b.png": ["Drama"], "c.png": ["Film Noir"]},
        ),
        # A header named otherwise is told by its first cell naming no image; extra columns are not a split.
        (
            ["img,label,width", "a.png,cat,8", "b.png,dog,8", "c.png,cat,8"],
            "multiclass",
            {"a.png": ["cat"], "b.png": ["dog"], "c.png": ["cat"]},
        ),
        # 0/1 columns written as floats or booleans.
        (
            ["image,cat,dog", "a.png,1.0,0.0", "b.png,True,True", "c.png,0,"],
            "multilabel",
            {"a.png": ["cat"], "b.png": ["cat", "dog"], "c.png": []},
        ),
    ],
    ids=["names-with-spaces", "singular-header", "few-images", "pipe", "other-header", "float-one-hot"],
)
def test_a_csv_s_labels_are_read_as_people_write_them(tmp_path, rows, task, expected):
    csv_path = write_rows(tmp_path / "list.csv", rows)
    found = find_images(csv_path)
    assert found.task == task and labels_by_image(found) == expected


def write_rows(path: Path, rows: list[str]) -> Path:
    (path.parent / "a.png").parent.mkdir(parents=True, exist_ok=True)
    for name in ("a.png", "b.png", "c.png"):
        Image.new("RGB", (8, 8)).save(path.parent / name)
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("rows", "task", "refusal"),
    [
        (
            ["path,labels", "a.png,cat dog", "b.png,cat"],
            "multiclass",
            "row 1 gives 2 labels and data.task is multiclass; set data.task: multilabel",
        ),
        (["path,label", "a.png,cat", "b.png,", "c.png,dog"], "auto", "row 2 has no label"),
        (["path,cat,dog", "a.png,1,2", "b.png,0,1"], "auto", "row 1 has '2' in the column dog; write 0 or 1"),
        (["path,labels", "a.png,cat", "b.png,", "c.png,cat"], "multilabel", "has only the class 'cat'"),
    ],
    ids=["several-labels-multiclass", "empty-label-multiclass", "one-hot-not-0-1", "one-class"],
)
def test_a_csv_that_cannot_be_read_is_refused_in_one_line(tmp_path, rows, task, refusal):
    csv_path = write_rows(tmp_path / "list.csv", rows)
    with pytest.raises(DataSettingError, match=refusal.replace(".", r"\.").replace("(", r"\(")):
        find_images(csv_path, task)


def test_a_class_absent_from_the_validation_images_is_refused_before_training(tmp_path):
    csv_path = write_multilabel_images(tmp_path / "ml", count=40)
    rows = csv_path.read_text().splitlines()
    # Every row gets a split; "yellow" only ever on training rows.
    marked = [rows[0] + ",split"] + [
        f"{row},{'train' if 'yellow' in row or index % 3 else 'val'}" for index, row in enumerate(rows[1:])
    ]
    csv_path.write_text("\n".join(marked) + "\n")
    data = ImageFolderDataModule(image_dir=str(csv_path), image_size=16, cache_dir=str(tmp_path / "packed"),
                                 pack_workers=1, batch_size=4, num_workers=0)  # fmt: skip
    data.prepare_data()
    with pytest.raises(
        DataSettingError, match=r"no validation image has the labels? (\w+, )*yellow, so (its|their) thresholds? cannot"
    ):
        data.setup("fit")


def test_the_held_out_split_of_multilabel_rows_has_every_label_and_mixing_mixes_the_label_vectors():
    rng = np.random.default_rng(0)
    labels = (rng.random((200, 5)) < [0.5, 0.3, 0.2, 0.05, 0.02]).astype(np.uint8)
    train, val, _ = stratified_split(labels, (0.2, 0.0), seed=0)
    assert len(np.intersect1d(train, val)) == 0 and len(train) + len(val) == 200
    assert labels[val].sum(axis=0).min() >= 1  # even the label of 2 % of the images is validated

    mixing = BatchAugment(0, "none", mixup_alpha=1.0, num_classes=5)
    mixing.seed(0)
    images = torch.zeros(8, 3, 8, 8, dtype=torch.uint8)
    rows = torch.from_numpy(labels[:8])
    _, mixed = mixing.mix(images, rows)
    rolled = rows.roll(1, 0).float()
    differs = (rows.float() != rolled).nonzero()[0]
    share = float((mixed[tuple(differs)] - rolled[tuple(differs)]) / (rows.float() - rolled)[tuple(differs)])
    assert mixed.dtype == torch.float32 and 0 <= share <= 1
    assert torch.allclose(mixed, share * rows.float() + (1 - share) * rolled, atol=1e-6)


def test_multilabel_fit_test_predict_export_and_register_agree_with_onnxruntime(tmp_path):
    csv_path = write_multilabel_images(tmp_path / "photos", count=200)
    fit = images_args(csv_path, "--data.image_size=32", "--data.test_fraction=0.25", "--data.batch_size=16",
                      "--model.backbone.width=8", "--trainer.max_epochs=8", "--data.mixup_alpha=0.2")  # fmt: skip
    trained = run_cli(*fit, cwd=tmp_path)
    said = trained.stdout + trained.stderr
    assert "labels.csv gives rows with several labels: data.task is multilabel" in said
    assert "val/mAP (mean average precision) replaces val/top1 as what ModelCheckpoint monitor" in said
    run_dir = only_run_dir(tmp_path)
    last = run_dir / "checkpoints" / "last.ckpt"
    record = torch.load(last, map_location="cpu", weights_only=False)["calibration"]
    assert record["task"] == "multilabel" and len(record["thresholds"]) == len(record["temperature"]) == 4

    evaluation = ["--config", str(run_dir / "config.yaml"), f"--ckpt_path={last}"]
    run_cli("test", *evaluation, cwd=tmp_path)
    (test_dir,) = (run_dir / "test").iterdir()
    page = (test_dir / "report.html").read_text()
    assert "mAP" in page and "most confident wrong labels" in page and "reliability" in page
    with open(test_dir / "per_class.csv") as handle:
        assert [row["class"] for row in csv.DictReader(handle)] == CLASSES
    with open(test_dir / "mistakes.csv") as handle:
        wrong = list(csv.DictReader(handle))
    assert wrong and page.count("<figure>") == len(wrong)  # each wrong label shown, the image as the network saw it
    for row in wrong:  # given below its threshold or missed above it: each row is a real mistake at the thresholds
        present, over = row["label"] in row["true_labels"].split(), float(row["p"]) >= float(row["threshold"])
        assert (row["wrong"], present, over) in {("given", False, True), ("missed", True, False)}, row
    events = EventAccumulator(str(test_dir), size_guidance={"tensors": 0})
    events.Reload()
    (table,) = [tag for tag in events.Tags()["tensors"] if "test/per_class" in tag]
    assert b"| class | AP |" in events.Tensors(table)[0].tensor_proto.string_val[0]

    run_cli("predict", *evaluation, cwd=tmp_path)
    with open(next((run_dir / "predict").glob("*/predictions.csv"))) as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["image", "labels", "probabilities", "unknown_because", "score", "top5"]
    for row in rows:
        if row["unknown_because"]:  # unlike the training images: no labels
            assert row["labels"] == "unknown" and row["probabilities"] == ""
            continue
        given = row["labels"].split()
        assert set(given) <= set(CLASSES) and len(row["probabilities"].split()) == len(given)
        for name, p in zip(given, row["probabilities"].split(), strict=True):
            assert float(p) >= record["thresholds"][CLASSES.index(name)] - 1e-4

    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    export = [sys.executable, str(PHOTO_ROOT / "export.py"), "--ckpt_path", str(last), "--formats", "onnx",
              "--register", "patches", "--tracking_uri", tracking]  # fmt: skip
    shipped = subprocess.run(export, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=cli_env())
    assert shipped.returncode == 0, shipped.stderr[-3000:]
    assert "registered patches version 1" in shipped.stdout
    card = json.loads((last.parent / "export" / "model.card.json").read_text())
    assert card["task"] == "multilabel" and card["calibration"]["thresholds"] == record["thresholds"]

    # The card's figures, counted again from onnxruntime's outputs on the test images with the card's thresholds.
    held_out = run_data_of(last).held_out  # the test split
    session = onnxruntime.InferenceSession(str(last.parent / "export" / "model.onnx"))
    outputs = session.run(["logits"], {"images": np.ascontiguousarray(held_out.images[:])})[0].astype(np.float64)
    probabilities, present = 1 / (1 + np.exp(-outputs)), np.asarray(held_out.labels).astype(bool)
    given = probabilities >= np.asarray(card["calibration"]["thresholds"])
    scored = card["artifacts"]["onnx"]["accuracy"]
    assert scored["images"] == len(present)
    assert scored["true_positives"] == int((given & present).sum()) and scored["labels_given"] == int(given.sum())
    assert scored["labels_present"] == int(present.sum())
    with_images = present.any(axis=0)
    by_sklearn = np.mean([average_precision_score(present[:, k], probabilities[:, k])
                          for k in np.flatnonzero(with_images)])  # fmt: skip
    assert math.isclose(scored["mAP"], by_sklearn, abs_tol=1e-6)
    assert scored["mAP"] > 0.6  # the patches are learnt, not guessed (chance is about the labels' share, 0.4)
    assert "| model.onnx | onnxruntime" in (last.parent / "export" / "model.card.md").read_text()

    # serve.py answers each photo as predict does: the labels at the card's thresholds, their probabilities.
    from .test_serve import post, running

    photos = csv_path.parent / "images"
    run_cli("predict", *evaluation, f"--data.predict_dir={photos}", cwd=tmp_path)
    listed = max((run_dir / "predict").glob("*/predictions.csv"), key=lambda path: path.stat().st_mtime)  # this one
    with open(listed) as handle:
        predicted = {row["image"]: row for row in csv.DictReader(handle)}
    command = [sys.executable, str(PHOTO_ROOT / "serve.py"), "--model", str(last.parent / "export")]
    with running(command, tmp_path, tmp_path / "serve.log") as url:
        for photo in sorted(photos.iterdir())[:40]:
            status, answer = post(f"{url}/predict", photo.read_bytes(), "image/png")
            row = predicted[photo.name]
            assert status == 200 and (answer["unknown_because"] or "") == row["unknown_because"], (answer, row)
            assert " ".join(answer["labels"]) == ("" if row["labels"] == "unknown" else row["labels"]), (answer, row)
            shares = [float(share) for share in row["probabilities"].split()]
            assert np.allclose(answer["probabilities"], shares, atol=5e-5), (answer, row)  # the CSV keeps 4 decimals


# --- imbalance -----------------------------------------------------------------------------------------------------


def write_overlapping_classes(folder: Path, common: int = 400, rare: int = 40, test_each: int = 60) -> Path:
    """Two classes told apart by a tint that each image's own colour cast blurs, ``common``:``rare`` in training.

    The classes overlap, so a plain loss on 10:1 data favours the common class; the test split is even.
    """
    rng = np.random.default_rng(0)

    def images(labels: np.ndarray) -> np.ndarray:
        tint = np.where(labels[:, None, None, None] == 1, 12, -12) * np.array([1, 0, -1])[None, None, None, :]
        cast = rng.normal(0, 20, (len(labels), 1, 1, 3))
        noise = rng.normal(0, 10, (len(labels), 32, 32, 3))
        return np.clip(128 + tint + cast + noise, 0, 255).astype(np.uint8)

    folder.mkdir(parents=True, exist_ok=True)
    train = np.r_[np.zeros(common, np.int64), np.ones(rare, np.int64)]
    test = np.r_[np.zeros(test_each, np.int64), np.ones(test_each, np.int64)]
    np.save(folder / "images.npy", images(train))
    np.save(folder / "labels.npy", train)
    np.save(folder / "test_images.npy", images(test))
    np.save(folder / "test_labels.npy", test)
    (folder / "classes.txt").write_text("common\nrare\n")
    return folder


def rare_recall(root: Path, *extra: str) -> float:
    """Fit on the imbalanced set with ``extra``, test, and read the rare class's recall from per_class.csv."""
    args = images_args(root / "data", "--data.val_fraction=0.2", "--data.batch_size=32", "--trainer.max_epochs=10",
                       "--model.backbone.width=8", "--model.label_smoothing=0", *extra)  # fmt: skip
    run_cli(*args, cwd=root)
    run_dir = only_run_dir(root)
    run_cli("test", "--config", str(run_dir / "config.yaml"), f"--ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}",
            cwd=root)  # fmt: skip
    (per_class,) = run_dir.glob("test/*/per_class.csv")
    with open(per_class) as handle:
        return next(float(row["recall"]) for row in csv.DictReader(handle) if row["class"] == "rare")


@pytest.mark.slow  # about a minute
def test_class_weights_and_the_balanced_sampler_each_lift_the_rare_class(tmp_path):
    recalls = {}
    for name, extra in {"plain": [], "weights": ["--model.class_weights=balanced"],
                        "sampler": ["--data.sampler=balanced"]}.items():  # fmt: skip
        root = tmp_path / name
        write_overlapping_classes(root / "data")
        recalls[name] = rare_recall(root, *extra)
    print("rare-class recall on the even test split:", recalls)
    assert recalls["weights"] > recalls["plain"] + 0.15, recalls
    assert recalls["sampler"] > recalls["plain"] + 0.15, recalls


def test_the_balanced_sampler_draws_each_class_alike_the_same_for_an_epoch_on_any_rank():
    labels = np.r_[np.zeros(900, np.int64), np.ones(100, np.int64)]
    weights = balanced_weights(labels)
    dataset = range(len(labels))

    def drawn(epoch: int, rank: int = 0, replicas: int = 1) -> list[int]:
        sampler = BalancedEpochSampler(dataset, lambda: epoch, weights, num_replicas=replicas, rank=rank, seed=7,
                                       drop_last=True)  # fmt: skip
        return list(sampler)

    first = drawn(0)
    assert len(first) == 1000 and 0.45 < labels[first].mean() < 0.55
    assert first == drawn(0) and first != drawn(1)
    shards = [drawn(0, rank, 2) for rank in range(2)]
    assert [len(shard) for shard in shards] == [500, 500]
    assert sorted(shards[0] + shards[1]) == sorted(first)  # the same draw, dealt over the ranks
    # Multi-label rows: by each image's rarest label.
    rows = np.zeros((10, 2), np.uint8)
    rows[:9, 0], rows[9, 1] = 1, 1
    assert torch.allclose(balanced_weights(rows), torch.tensor([1 / 9] * 9 + [1.0], dtype=torch.float64))


# --- calibration and "unknown" -------------------------------------------------------------------------------------


def test_the_fitting_rules_on_known_numbers():
    # A rejection threshold keeps exactly the configured share of correct answers.
    scores = torch.arange(100, dtype=torch.float32) / 100
    correct = torch.ones(100, dtype=torch.bool)
    threshold = rejection_threshold(scores, correct, 0.95)
    assert int((scores[correct] >= threshold).sum()) == 95
    # An over-confident model (logits 5x too large) gets a temperature near 5.
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 3, (4000,), generator=generator)
    honest = torch.randn(4000, 3, generator=generator) + 2 * torch.nn.functional.one_hot(labels, 3)
    drawn = torch.distributions.Categorical(logits=honest).sample()
    assert 4.0 < float(fit_temperature(5 * honest, drawn, multilabel=False)) < 6.0
    # Multi-label: a class the validation images separate does not run its temperature towards 0 (free, it does).
    present = torch.randint(0, 2, (150, 2), generator=generator).float()
    separable = 2 * (2 * present[:, 0] - 1) + 0.3 * torch.randn(150, generator=generator)
    noisy = 0.5 * (2 * present[:, 1] - 1) + torch.randn(150, generator=generator)
    logits = torch.stack([separable, noisy], dim=1)
    assert float(fit_temperature(logits, present, multilabel=True)[0]) > 0.3
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(calibration, "SHARED_TEMPERATURE_IMAGES", 0.0)
        assert float(fit_temperature(logits, present, multilabel=True)[0]) < 0.1
    # The F1-best threshold of a class separates its positives from its negatives.
    probabilities = torch.tensor([[0.9], [0.8], [0.3], [0.2]])
    assert 0.3 < float(best_f1_thresholds(probabilities, torch.tensor([[1], [1], [0], [0]]))[0]) < 0.8


def test_a_checkpoint_keeps_every_score_s_threshold_so_predict_may_switch(caplog):
    """Each score's "unlike the training images" threshold keeps keep_in_domain of all validation images, so a
    restored model may answer by any of them; the likely-mistake threshold keeps keep_correct of the correct ones."""
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 3, (400,), generator=generator)
    logits = torch.randn(400, 3, generator=generator) + 2 * torch.nn.functional.one_hot(labels, 3)
    features, training = torch.randn(400, 8, generator=generator), torch.randn(300, 8, generator=generator)
    fitted = Calibration("multiclass", 3, reject_with="knn", keep_correct=0.9, keep_in_domain=0.9)
    fitted.collect(logits, labels, features)
    fitted.fit(training)
    checkpoint: dict = {}
    fitted.save_to(checkpoint)
    record = checkpoint["calibration"]
    assert set(record["domain"]["thresholds"]) == {"knn", "energy", "msp"} and checkpoint["domain_bank"].shape == (
        300,
        8,
    )
    for score in ("knn", "energy", "msp"):
        restored = Calibration("multiclass", 3, reject_with=score, keep_correct=0.9, keep_in_domain=0.9)
        restored.restore_from(checkpoint)
        assert float(restored.domain_threshold) == pytest.approx(record["domain"]["thresholds"][score], rel=1e-6)
        assert abs(float(restored.in_domain(logits, features).float().mean()) - 0.9) < 0.01
    correct = fitted.probabilities(logits).argmax(dim=1) == labels
    sure = fitted.scores(logits, "msp") >= fitted.rejection
    assert abs(float(sure[correct].float().mean()) - 0.9) < 0.01 and record["rejection"]["keep_correct"] == 0.9
    # A record of an earlier release (no domain thresholds): the likely-mistake threshold is taken, no image is
    # called unlike the training ones, and a line says so; so does a keep_in_domain other than the fitted one.
    earlier = {key: value for key, value in record.items() if key != "domain"}
    with caplog.at_level("INFO"):
        old = Calibration("multiclass", 3, reject_with="knn", keep_correct=0.9)
        old.restore(earlier)
        Calibration("multiclass", 3, reject_with="knn", keep_in_domain=0.95).restore_from(checkpoint)
    assert float(old.domain_threshold) == -math.inf and float(old.rejection) == record["rejection"]["threshold"]
    assert bool(old.in_domain(torch.zeros(2, 3)).all())
    assert 'the checkpoint has no "knn" threshold for images unlike the training ones' in caplog.text
    assert "keeps 0.9 of the validation images, as fitted; model.keep_in_domain 0.95 takes a fit" in caplog.text


def write_noisy_arrays(folder: Path, per_class: int = 150) -> Path:
    """Three colour classes under heavy noise, a fifth of the training labels wrong: a model trained long on it
    learns the wrong labels too, and grows over-confident."""
    rng = np.random.default_rng(1)
    colours = np.array([[200, 60, 60], [60, 200, 60], [60, 60, 200]])
    labels = np.repeat(np.arange(3), per_class)
    shown = np.where(rng.random(len(labels)) < 0.2, rng.integers(0, 3, len(labels)), labels)
    pixels = colours[shown][:, None, None, :] + rng.normal(0, 70, (len(labels), 32, 32, 3))
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "images.npy", np.clip(pixels, 0, 255).astype(np.uint8))
    np.save(folder / "labels.npy", labels)
    return folder


@pytest.mark.slow  # twenty epochs to over-fit: the full tier (-m slow); CI fits calibration in every run
def test_temperature_scaling_mends_an_over_confident_model_and_unknown_keeps_its_share(tmp_path):
    write_noisy_arrays(tmp_path / "photos")
    args = images_args(tmp_path / "photos", "--data.test_fraction=0.25", "--data.batch_size=16",
                       "--model.backbone.width=16", "--model.label_smoothing=0", "--trainer.max_epochs=20",
                       "--data.random_resized_crop=false", "--data.crop_padding=0", "--data.flip=none",
                       "--model.keep_correct=0.9")  # fmt: skip
    run_cli(*args, cwd=tmp_path)
    run_dir = only_run_dir(tmp_path)
    last = run_dir / "checkpoints" / "last.ckpt"
    record = torch.load(last, map_location="cpu", weights_only=False)["calibration"]
    fitted = record["fitted_on"]
    assert record["temperature"][0] > 1.2, record  # over-confident: probabilities softened
    # The threshold keeps the configured share of the correct validation answers (as few dropped as that allows).
    assert 0.9 <= fitted["kept_correct"] < 0.9 + 1 / (0.1 * fitted["images"]) + 0.05
    # Counted again here: the checkpoint's model on the run's validation images, its score against the threshold.
    model = PhotoClassifier.load_from_checkpoint(last, map_location="cpu").eval()
    validation = run_data_of(last).datamodule
    images = torch.from_numpy(np.asarray(validation.validation_images().images[:]))
    truth = torch.from_numpy(np.asarray(validation.validation_images().labels))
    with torch.inference_mode():
        logits = model.evaluate(images)
    temperature = record["temperature"][0]
    probabilities = torch.softmax(logits / temperature, dim=1)
    # The temperature lowers the log loss it was fitted on; the recorded ECEs are these images' (15 bins on about a
    # hundred photos: the ECE itself may move either way by chance, and does with one CPU thread's arithmetic).
    assert fitted["ece_before"] == pytest.approx(calibration.calibration_error(logits.softmax(dim=1), truth, False))
    assert fitted["ece_after"] == pytest.approx(calibration.calibration_error(probabilities, truth, False))
    assert log_loss(logits / temperature, truth) < log_loss(logits, truth)
    correct = probabilities.argmax(dim=1) == truth
    kept = probabilities.max(dim=1).values[correct] >= record["rejection"]["threshold"]
    assert len(truth) == fitted["images"] and float(kept.float().mean()) == pytest.approx(fitted["kept_correct"])
    dropped = int((~kept).sum())  # as few as keeping 90 % allows: one more kept would be under 90 %
    assert dropped == int(0.1 * int(correct.sum()) + 1e-9), (dropped, int(correct.sum()))

    evaluation = ["--config", str(run_dir / "config.yaml"), f"--ckpt_path={last}"]
    run_cli("test", *evaluation, cwd=tmp_path)
    (page,) = run_dir.glob("test/*/report.html")
    text = page.read_text()
    before, after = (float(x) for x in _between(text, 'calibration error (ECE)</td><td class="text">', " before"))
    # On the test split, which the temperature was not fitted on: the report's figures are that split's, and the
    # log loss falls there too.
    tested = validation.held_out_images()
    with torch.inference_mode():
        logits = model.evaluate(torch.from_numpy(np.asarray(tested.images[:])))
    truth = torch.from_numpy(np.asarray(tested.labels))
    for shown, scaled in ((before, logits), (after, logits / temperature)):
        assert shown == pytest.approx(calibration.calibration_error(scaled.softmax(dim=1), truth, False), abs=1e-4)
    assert log_loss(logits / temperature, truth) < log_loss(logits, truth)
    assert "accuracy against coverage" in text.lower()

    # Photos unlike the training images (flat grey, a checkerboard, stripes, noise) are "unknown" more often.
    strange = tmp_path / "strange"
    strange.mkdir()
    rng = np.random.default_rng(2)
    for index in range(24):
        kind = index % 4
        if kind == 0:
            pixels = np.full((32, 32, 3), 40 + 8 * index)
        elif kind == 1:
            pixels = (np.indices((32, 32)).sum(0) % 2 * 255)[..., None].repeat(3, 2)
        elif kind == 2:
            pixels = np.tile((np.arange(32) % 8 < 4)[None, :, None] * 255, (32, 1, 3))
        else:
            pixels = rng.integers(0, 256, (32, 32, 3))
        Image.fromarray(pixels.astype(np.uint8)).save(strange / f"{index:02d}.png")

    def unknown_share(*extra: str) -> float:
        run_cli("predict", *evaluation, *extra, cwd=tmp_path)
        newest = max(run_dir.glob("predict/*/predictions.csv"), key=lambda path: path.stat().st_mtime)
        with open(newest) as handle:
            rows = list(csv.DictReader(handle))
        return sum(row["predicted"] == "unknown" for row in rows) / len(rows)

    on_test = unknown_share()
    on_strange = unknown_share(f"--data.predict_dir={strange}")
    print(f"temperature {record['temperature'][0]:.2f}; test ECE {before:.4f} -> {after:.4f}; unknown: "
          f"{on_test:.2f} of the test split, {on_strange:.2f} of the strange photos")  # fmt: skip
    assert on_strange > on_test + 0.15, (on_strange, on_test)
    card_args = [sys.executable, str(PHOTO_ROOT / "export.py"), "--ckpt_path", str(last), "--formats", "onnx"]
    shipped = subprocess.run(card_args, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=cli_env())
    assert shipped.returncode == 0, shipped.stderr[-3000:]
    unknown = json.loads((last.parent / "export" / "model.card.json").read_text())["calibration"]["unknown"]
    assert unknown["coverage_on_validation"] == pytest.approx(fitted["coverage"])
    assert unknown["likely_mistake"]["threshold"] == record["rejection"]["threshold"]
    assert "answer 'unknown' where max(softmax(logits)) <" in unknown["likely_mistake"]["rule"]
    assert unknown["unlike_training"]["score"] == "knn" and "output 'score' <" in unknown["unlike_training"]["rule"]


def log_loss(logits: torch.Tensor, truth: torch.Tensor) -> float:
    return float(torch.nn.functional.cross_entropy(logits, truth))


def _between(text: str, start: str, end: str) -> tuple[str, str]:
    """'0.0123 calibrated, 0.0456' of the report's ECE row, as (before, after)."""
    cell = text.split(start, 1)[1].split(end, 1)[0]  # "0.0123 calibrated, 0.0456"
    after, before = cell.replace(" calibrated", "").split(", ")
    return before, after
