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

import warnings

import numpy as np

from .errors import DataSettingError


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
    from sklearn.model_selection import StratifiedGroupKFold

    from .dataset import strata

    names, group_ids = np.unique(groups, return_inverse=True)
    if len(names) < folds:
        raise DataSettingError(
            f"the images form {len(names)} groups, fewer than data.folds={folds}: a group is never split over folds; "
            f"lower data.folds to at most {len(names)}, or give more groups"
        )
    fold = np.zeros(len(labels), dtype=np.int64)
    splitter = StratifiedGroupKFold(n_splits=folds, shuffle=True, random_state=seed)
    with warnings.catch_warnings():  # a class with fewer groups than folds: dealt as well as it can be
        warnings.simplefilter("ignore", UserWarning)
        for k, (_, held) in enumerate(splitter.split(np.zeros(len(labels)), strata(labels), group_ids)):
            fold[held] = k
    return fold


def group_of_key(key: str, layout_depth: int) -> str:
    """The group of an image found in folders: the first folder below its class folder, else the image itself.

    ``layout_depth`` is how many folders lead to the class folder's contents (1: ``<class>/``, 2:
    ``<split>/<class>/``); ``ants/colony7/001.jpg`` is in group ``colony7``, ``ants/001.jpg`` alone.
    """
    parts = key.split("/")
    return parts[layout_depth] if len(parts) > layout_depth + 1 else key
