"""Cross-validation folds: stratified, iteratively for several labels, groups kept whole; the spread of a figure."""

from __future__ import annotations

import math

import numpy as np
import pytest

from classifier_engine.cross_validation.fold_figures import Spread, spreads, t_975
from classifier_engine.data.errors import DataSettingError
from classifier_engine.data.folds import fold_of_each, group_of_key
from classifier_engine.data.image_sources import find_images

from .conftest import write_image_folder


def test_one_label_folds_deal_each_class_round_robin_as_check_labels_always_did():
    """Runs of earlier releases are continued on the same folds: each class shuffled by the seed, dealt in turn."""
    labels = np.arange(50) % 3
    rng = np.random.default_rng(7)
    expected = np.zeros(50, dtype=np.int64)
    for label in range(3):
        members = rng.permutation(np.flatnonzero(labels == label))
        for fold in range(4):
            expected[members[fold::4]] = fold
    assert np.array_equal(fold_of_each(labels, 4, seed=7), expected)
    assert np.array_equal(fold_of_each(labels, 4, seed=7, groups=np.arange(50).astype(str)), expected)


def test_several_labels_are_spread_over_every_fold_by_iterative_stratification():
    """Each label's images per fold stay nearer their share than dealing each image by its rarest label does."""
    from classifier_engine.data.folds import strata

    rng = np.random.default_rng(1)
    present = (rng.random((300, 12)) < np.linspace(0.03, 0.5, 12)).astype(np.int64)
    share = present.sum(axis=0) / 5

    def deviation(folds: np.ndarray) -> np.ndarray:
        return np.abs(np.stack([present[folds == k].sum(axis=0) for k in range(5)]) - share).max(axis=0)

    folds = fold_of_each(present, 5, seed=0)
    assert sorted(set(folds)) == list(range(5)) and np.bincount(folds).min() >= 300 / 5 - 3
    by_rarest = fold_of_each(strata(present), 5, seed=0)
    assert deviation(folds).sum() < deviation(by_rarest).sum()
    assert deviation(folds)[:9].max() <= 1  # the rarer labels: within one image of their share in every fold


def test_a_group_lands_in_one_fold_where_dealing_by_class_would_split_it():
    labels = np.repeat([0, 1, 2], 20)
    groups = np.array([f"subject{index // 4}" for index in range(60)])  # 15 subjects of 4 photos of one class
    plain = fold_of_each(labels, 5, seed=0)
    assert any(len(set(plain[groups == name])) > 1 for name in set(groups))  # the test means something
    grouped = fold_of_each(labels, 5, seed=0, groups=groups)
    assert all(len(set(grouped[groups == name])) == 1 for name in set(groups))
    for fold in range(5):  # still stratified: each fold holds a subject of every class
        assert set(labels[grouped == fold]) == {0, 1, 2}


def test_fewer_groups_than_folds_is_refused_with_what_to_do():
    with pytest.raises(DataSettingError, match=r"3 groups, fewer than data\.folds=5.*lower data\.folds"):
        fold_of_each(np.arange(12) % 2, 5, seed=0, groups=np.repeat(["a", "b", "c"], 4))


def test_groups_come_from_a_csv_column_or_a_folder_below_the_class_folder(tmp_path):
    write_image_folder(tmp_path / "photos", ("cat", "dog"), per_class=4)
    rows = ["path,label,group"] + [
        f"photos/{name}/{index:03d}.{('jpg', 'png', 'PNG', 'webp')[index % 4]},{name},owner{index % 2}"
        for name in ("cat", "dog") for index in range(4)
    ]  # fmt: skip
    (tmp_path / "list.csv").write_text("\n".join(rows) + "\n")
    found = find_images(tmp_path / "list.csv")
    assert found.class_names == ["cat", "dog"] and found.task == "multiclass"
    assert found.groups["photos/cat/001.png"] == "owner1" and len(found.groups) == 8
    assert group_of_key("cat/colony7/001.jpg", 1) == "colony7" and group_of_key("cat/001.jpg", 1) == "cat/001.jpg"
    assert group_of_key("train/cat/colony7/001.jpg", 2) == "colony7"


def test_the_95_percent_interval_of_the_mean_uses_student_s_t():
    # five folds: t(0.975, 4) = 2.776 (a table's value); s = 0.0158, half-width 2.776 * s / sqrt(5)
    spread = Spread((0.80, 0.82, 0.78, 0.81, 0.79))
    low, high = spread.interval
    assert spread.mean == pytest.approx(0.80) and spread.std == pytest.approx(0.0158114, rel=1e-5)
    assert (high - low) / 2 == pytest.approx(2.776 * 0.0158114 / math.sqrt(5), rel=1e-4)
    assert t_975(4) == 2.776 and t_975(22) == 2.060 and t_975(1000) == 1.980
    assert math.isnan(Spread((0.5,)).std)


def test_an_interval_ends_where_its_figure_can():
    # Five folds at 0.90-1.00: the t interval's upper end would pass 1, which no share reaches.
    per_fold = [{"top1": value, "labels_per_image": value * 2} for value in (0.90, 1.0, 1.0, 1.0, 0.95)]
    summary = spreads(per_fold)
    mean, std = summary["top1"].mean, summary["top1"].std
    assert mean + t_975(4) * std / math.sqrt(5) > 1 and summary["top1"].interval[1] == 1.0
    assert summary["top1"].interval[0] == pytest.approx(mean - t_975(4) * std / math.sqrt(5))
    assert summary["labels_per_image"].interval[1] > 2.0  # a count, not a share: unbounded above


def test_more_folds_than_a_class_has_images_or_a_folder_with_its_own_val_split_is_refused(tmp_path):
    from classifier_engine import ImageFolderDataModule

    write_image_folder(tmp_path / "photos", ("cat", "dog"), per_class=3)
    with pytest.raises(DataSettingError, match=r"data\.folds=4 is more folds than the largest class has images"):
        ImageFolderDataModule(image_dir=str(tmp_path / "photos"), folds=4, cache_dir=str(tmp_path / "packed"))
    write_image_folder(tmp_path / "split" / "train", ("cat", "dog"), per_class=6)
    write_image_folder(tmp_path / "split" / "val", ("cat", "dog"), per_class=2)
    with pytest.raises(DataSettingError, match=r"its own val split.*data\.pool_val true"):
        ImageFolderDataModule(image_dir=str(tmp_path / "split"), folds=3, cache_dir=str(tmp_path / "packed"))
    pooled = ImageFolderDataModule(image_dir=str(tmp_path / "split"), folds=3, pool_val=True,
                                   cache_dir=str(tmp_path / "packed"))  # fmt: skip
    assert pooled.images_counted == 16 and pooled.class_counts == [8, 8]
