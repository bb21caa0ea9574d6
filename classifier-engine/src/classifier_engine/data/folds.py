"""Which fold each training image is held out in, for cross-validation (``data.folds``).

Three ways, by what the images carry:

- **one label each**: each class's images are shuffled by the seed and dealt round-robin, so every fold holds
  each class in its share;
- **several labels each**: iterative stratification (Sechidis, Tsoumakas and Vlahavas, 2011): the rarest label
  left is dealt first, each image to the fold that still lacks most of that label, so rare labels spread
  over the folds and each fold's label counts stay near their share;
- **groups** (a CSV list's ``group`` column, or a subfolder of a class folder): every image of one group
  lands in one fold, so near-duplicates of one subject, patient or session never sit on both sides of a
  fold; the groups are dealt stratified by their images' classes (scikit-learn's ``StratifiedGroupKFold``).

In every case the folds of one seed partition the images: each is held out exactly once.
"""

from __future__ import annotations

import numpy as np

from .errors import DataSettingError


def strata(labels: np.ndarray) -> np.ndarray:
    """What a split is stratified by: the class, or for multi-label rows (N, classes) the rarest class present.

    Every image of a rare class then lands in that class's stratum, so a held-out split gets some of each
    class that has at least two images (rows with no class form a stratum of their own).
    """
    if labels.ndim == 1:
        return labels
    present = labels.astype(bool)
    frequency = present.sum(axis=0)
    rarity = np.where(present, frequency[None, :], np.iinfo(np.int64).max)
    return np.where(present.any(axis=1), rarity.argmin(axis=1), labels.shape[1])


def fold_of_each(labels: np.ndarray, folds: int, seed: int, groups: np.ndarray | None = None) -> np.ndarray:
    """The fold (0 .. folds - 1) each image is held out in; ``labels`` (N,) classes or (N, classes) 0/1."""
    if groups is not None and len(np.unique(groups)) < len(groups):
        return _by_group(labels, folds, seed, groups)
    if labels.ndim == 2:
        return _iterative_stratification(labels.astype(bool), folds, seed)
    return _round_robin(labels, folds, seed)


def _round_robin(labels: np.ndarray, folds: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    fold = np.zeros(len(labels), dtype=np.int64)
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        for k in range(folds):
            fold[members[k::folds]] = k
    return fold


def _iterative_stratification(present: np.ndarray, folds: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    count = len(present)
    wanted = np.full(folds, count / folds)  # images each fold still wants
    wanted_of_label = np.outer(np.full(folds, 1 / folds), present.sum(axis=0))  # (folds, classes)
    fold = np.full(count, -1, dtype=np.int64)
    left = present.copy()
    while left.any():
        remaining = left.sum(axis=0)
        label = int(np.argmin(np.where(remaining > 0, remaining, np.iinfo(np.int64).max)))
        for row in rng.permutation(np.flatnonzero(left[:, label])):
            need = wanted_of_label[:, label]
            best = np.flatnonzero(need == need.max())
            if len(best) > 1:
                best = best[wanted[best] == wanted[best].max()]
            chosen = int(rng.choice(best))
            fold[row] = chosen
            wanted[chosen] -= 1
            wanted_of_label[chosen] -= present[row]
            left[row] = False
    for row in rng.permutation(np.flatnonzero(fold < 0)):  # images with no label: wherever most are wanted
        chosen = int(rng.choice(np.flatnonzero(wanted == wanted.max())))
        fold[row] = chosen
        wanted[chosen] -= 1
    return fold


def _by_group(labels: np.ndarray, folds: int, seed: int, groups: np.ndarray) -> np.ndarray:
    """Whole groups, shuffled by the seed and taken largest (then least even in its classes) first, each to the
    fold where the classes' shares over the folds stay most even; a tie goes to the fold with fewest images.
    The rule of scikit-learn's ``StratifiedGroupKFold``, here without that dependency."""
    names, group_of_row = np.unique(groups, return_inverse=True)
    if len(names) < folds:
        raise DataSettingError(
            f"the images form {len(names)} groups, fewer than data.folds={folds}: a group is never split over folds; "
            f"lower data.folds to at most {len(names)}, or give more groups"
        )
    _, class_of_row = np.unique(strata(labels), return_inverse=True)
    per_group = np.zeros((len(names), class_of_row.max() + 1))
    np.add.at(per_group, (group_of_row, class_of_row), 1)
    totals = per_group.sum(axis=0)
    order = np.random.default_rng(seed).permutation(len(names))
    unevenness = (per_group / per_group.sum(axis=1, keepdims=True)).std(axis=1)
    order = order[np.lexsort((-unevenness[order], -per_group[order].sum(axis=1)))]
    per_fold = np.zeros((folds, per_group.shape[1]))
    fold_of_group = np.zeros(len(names), dtype=np.int64)
    for group in order:
        spread = []
        for fold in range(folds):
            per_fold[fold] += per_group[group]
            spread.append((float((per_fold / totals).std(axis=0).mean()), float(per_fold[fold].sum())))
            per_fold[fold] -= per_group[group]
        chosen = min(range(folds), key=lambda fold: spread[fold])
        per_fold[chosen] += per_group[group]
        fold_of_group[group] = chosen
    return fold_of_group[group_of_row]


def group_of_key(key: str, layout_depth: int) -> str:
    """The group of an image found in folders: the first folder below its class folder, else the image itself.

    ``layout_depth`` is how many folders lead to the class folder's contents (1: ``<class>/``, 2:
    ``<split>/<class>/``); ``ants/colony7/001.jpg`` is in group ``colony7``, ``ants/001.jpg`` alone.
    """
    parts = key.split("/")
    return parts[layout_depth] if len(parts) > layout_depth + 1 else key
