"""How well each "unknown" score tells photos of the training kind from photos of another kind, on real photos.

    python -m classifier_engine.bench unknown --sets ants_bees/ clothing/ --weights_path FILE
        [--epochs 5] [--seeds 3] [--mosaics] [--quick]

Each set holds ``train/`` and ``val/`` folders of class folders. For every set and seed the photo config as
shipped is fine-tuned (``main.py fit``); its checkpoint then scores three kinds of images, read as ``predict``
reads files (the checkpoint's preprocessing record):

- **in the domain**: the set's own validation photos;
- **far**: handwritten digits (scikit-learn's 8x8 scans, enlarged), another kind of image altogether;
- **near**: real photos of the other set's classes (for the first set, the second's validation photos, and
  the reverse).

Per score it prints AUROC (in-domain against off-domain), the false-positive rate at 95% in-domain coverage
(the share of off-domain photos still answered when 95% of the validation photos are kept), and the share
answered "unknown" by the checkpoint's own threshold. The scores: the shipped ``knn`` (the checkpoint's bank),
``energy`` and ``msp`` on the calibrated logits, and two measured beside them from the same features:
``mahalanobis`` (class means and a shared covariance of the training features; Lee et al., 2018) and ``vim``
(the residual off the training features' principal subspace as a virtual logit; Wang et al., 2022).

It also times ``predict``'s answer (logits, features and the knn score from one pass) against the forward pass
alone on the CPU. ``--mosaics`` adds the several-labels case: 2x2 mosaics of both sets' photos, where the
count-constrained thresholds are compared with the F1-best ones on held-out mosaics (mAP, micro-F1, labels given
against true) and the digits are scored as far off-domain. The last line is one JSON object of every figure.

``--quick`` (what the tests run) checks the script works on generated photos with a small network from random
weights; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from ..data.image_files import decode_image
from ..data.preprocessing import Preprocessing
from ..export.model_loading import load_model
from ..models.calibration import best_f1_thresholds, count_matched_thresholds
from ..models.domain import find_head, keeping_threshold, knn_scores
from ..models.network_parts import logits_and_features
from .project import PROJECT_ROOT as PROJECT
from .project import ImageClassifier

IMAGES_CONFIG = PROJECT / "configs" / "images.yaml"
SCORES = ("knn", "mahalanobis", "vim", "energy", "msp")
SHIPPED = ("knn", "energy", "msp")
SUFFIXES = {".jpg", ".jpeg", ".png", ".webp"}


def write_digits(folder: Path, count: int = 200) -> Path:
    """scikit-learn's handwritten digits (8x8, 16 grey levels), enlarged to 64x64 PNGs."""
    from PIL import Image
    from sklearn.datasets import load_digits

    folder.mkdir(parents=True, exist_ok=True)
    for index, digit in enumerate(load_digits().images[:count]):
        pixels = (255 - digit * 255 / 16).astype(np.uint8)  # dark ink on white paper
        Image.fromarray(pixels).resize((64, 64), Image.Resampling.NEAREST).convert("RGB").save(folder / f"{index}.png")
    return folder


def write_mosaics(sources: list[Path], folder: Path, count: int, seed: int) -> Path:
    """2x2 mosaics of random photos of every set's ``train/`` and ``val/``, listed with their classes in a CSV.

    Both sets' classes together give a label set of about three of a dozen classes per mosaic, so the count rule
    has something to get wrong (one set of two classes would give at most two labels).
    """
    from PIL import Image

    photos = sorted(
        (path.parent.name, path)
        for source in sources
        for split in ("train", "val")
        for path in (source / split).rglob("*")
        if path.suffix.lower() in SUFFIXES
    )
    rng = np.random.default_rng(seed)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    rows = ["path,labels"]
    for index in range(count):
        chosen = [photos[i] for i in rng.integers(0, len(photos), 4)]
        mosaic = Image.new("RGB", (256, 256))
        for tile, (_, path) in enumerate(chosen):
            with Image.open(path) as image:
                mosaic.paste(image.convert("RGB").resize((128, 128)), ((tile % 2) * 128, (tile // 2) * 128))
        mosaic.save(folder / "images" / f"{index:04d}.jpg", quality=92)
        rows.append(f"images/{index:04d}.jpg,{' '.join(sorted({name for name, _ in chosen}))}")
    (folder / "labels.csv").write_text("\n".join(rows) + "\n")
    return folder / "labels.csv"


def write_quick_sets(folder: Path) -> list[Path]:
    """Two generated sets of noisy colour fields (for --quick)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    sets = []
    for offset, name in ((0, "warm"), (90, "cool")):
        for split, count in (("train", 16), ("val", 8)):
            for label in range(2):
                (folder / name / split / f"c{label}").mkdir(parents=True, exist_ok=True)
                for index in range(count):
                    colour = (200 - offset, 60 + 60 * label, 60 + offset)
                    pixels = np.clip(rng.normal(colour, 40, (48, 48, 3)), 0, 255).astype(np.uint8)
                    Image.fromarray(pixels).save(folder / name / split / f"c{label}" / f"{index}.png")
        sets.append(folder / name)
    return sets


def files_of(folder: Path) -> list[Path]:
    return sorted(path for path in folder.rglob("*") if path.suffix.lower() in SUFFIXES)


def fit(args: argparse.Namespace, data: Path, seed: int, root: Path, extra: list[str]) -> Path:
    """``main.py fit`` of the photo config on ``data``; returns the run's last checkpoint."""
    root.mkdir(parents=True)
    weights = [f"--model.backbone.weights_path={args.weights_path}"] if args.weights_path else []
    command = [
        sys.executable,
        str(PROJECT / "main.py"),
        "fit",
        "--config",
        str(IMAGES_CONFIG),
        *weights,
        *args.extra,
        *extra,
        f"--data.image_dir={data}",
        f"--trainer.max_epochs={args.epochs}",
        f"--seed_everything={seed}",
        "--trainer.enable_progress_bar=false",
    ]
    result = subprocess.run(command, cwd=root, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"error: the fit on {data} (seed {seed}) failed: {(result.stderr.strip().splitlines() or ['?'])[-1]}")
    (last,) = root.glob("runs/*/*/checkpoints/last.ckpt")
    return last


class Scored:
    """A trained checkpoint and what it computes of images: logits and features in one pass, then every score."""

    def __init__(self, last: Path) -> None:
        self.model, checkpoint = load_model(last, ImageClassifier)  # as export reads it: plain data, checked
        self.model.eval()
        self.checkpoint = checkpoint
        self.record = Preprocessing.of_checkpoint(checkpoint)
        self.calibration = self.model.calibration
        self.head: torch.nn.Module | None = None  # found on the first images scored

    def images(self, paths: list[Path]) -> torch.Tensor:
        record = self.record
        decoded = [
            decode_image(path, record.image_size, record.resize, record.interpolation, record.crop_pct)
            for path in paths
        ]
        return torch.from_numpy(np.stack(decoded).transpose(0, 3, 1, 2).copy())

    def outputs(self, images: torch.Tensor, batch: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
        logits, features = [], []
        self.head = self.head or find_head(self.model, images[:2])
        head = self.head
        with torch.no_grad():
            for start in range(0, len(images), batch):
                chunk = images[start : start + batch]
                out, feat = logits_and_features(head, lambda chunk=chunk: self.model.evaluate(chunk))
                logits.append(out)
                features.append(feat)
        return torch.cat(logits), torch.cat(features)

    def fit_extra_scores(self, train_images: torch.Tensor, train_labels: np.ndarray) -> None:
        """Mahalanobis and ViM need the training features with their classes, and the head's weights."""
        logits, features = self.outputs(train_images)
        features = features.double()
        self.means = torch.stack(
            [features[torch.from_numpy(train_labels == c)].mean(0) for c in range(len(self.model.class_names))]
        )
        centred = features - self.means[torch.from_numpy(train_labels)]
        self.precision = torch.linalg.pinv(centred.T @ centred / len(features), hermitian=True)
        head = self.head
        weight, bias = head.weight.detach().double(), head.bias.detach().double()
        self.origin = -torch.linalg.pinv(weight) @ bias
        dimension = features.shape[1]
        kept = 1000 if dimension >= 1500 else max(1, dimension // 2)  # the ViM paper's principal dimension
        _, vectors = torch.linalg.eigh(torch.cov((features - self.origin).T))
        self.residual_space = vectors[:, : dimension - kept]  # eigenvalues ascend: the smallest directions
        residual = ((features - self.origin) @ self.residual_space).norm(dim=1)
        self.vim_alpha = float(logits.double().max(1).values.mean() / residual.mean())

    def scores(self, images: torch.Tensor) -> dict[str, np.ndarray]:
        logits, features = self.outputs(images)
        calibration = self.calibration
        f = features.double()
        distances = torch.stack([((f - mean) @ self.precision * (f - mean)).sum(1) for mean in self.means], 1)
        residual = ((f - self.origin) @ self.residual_space).norm(dim=1)
        raw = logits.double() * calibration.temperature.double()  # the network's own logits (evaluate's are raw)
        return {
            "knn": knn_scores(features, calibration.bank).numpy(),
            "mahalanobis": (-distances.min(1).values).numpy(),
            "vim": (torch.logsumexp(raw, 1) - self.vim_alpha * residual).numpy(),
            "energy": calibration.scores(logits, "energy").numpy(),
            "msp": calibration.scores(logits, "msp").numpy(),
        }


def auroc(inside: np.ndarray, outside: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(np.r_[np.ones(len(inside)), np.zeros(len(outside))], np.r_[inside, outside]))


def figures(scored: Scored, inside: dict[str, np.ndarray], outside: dict[str, np.ndarray]) -> dict[str, dict]:
    """Per score: AUROC, FPR at 95 % in-domain coverage, the share unknown by the checkpoint's own threshold."""
    thresholds = scored.calibration.by_score
    table = {}
    for score in SCORES:
        at_95 = keeping_threshold(torch.from_numpy(inside[score]), 0.95)
        own = thresholds.get(score, at_95)
        table[score] = {
            "auroc": auroc(inside[score], outside[score]),
            "fpr95": float((outside[score] >= at_95).mean()),
            "unknown": float((outside[score] < own).mean()),
            "in_domain_kept": float((inside[score] >= own).mean()),
        }
    return table


def predict_cost(scored: Scored, images: torch.Tensor, rounds: int = 7) -> float:
    """predict's answer (one pass: logits, features, knn, calibrated answers) over the forward pass alone."""
    head = find_head(scored.model, images[:2])
    torch.set_num_threads(max(1, torch.get_num_threads()))
    plain, answered = [], []
    with torch.no_grad():
        for _ in range(rounds):
            start = time.perf_counter()
            scored.model.evaluate(images)
            plain.append(time.perf_counter() - start)
            start = time.perf_counter()
            logits, features = logits_and_features(head, lambda: scored.model.evaluate(images))
            scored.calibration.answers(logits, features)
            answered.append(time.perf_counter() - start)
    return statistics.median(answered) / statistics.median(plain)


def one_label(args: argparse.Namespace, scratch: Path, far: Path) -> dict:
    results: dict = {}
    for position, data in enumerate(args.sets):
        near = args.sets[1 - position] / "val"
        train_files, val_files = files_of(data / "train"), files_of(data / "val")
        classes = sorted(path.name for path in (data / "train").iterdir() if path.is_dir())
        train_labels = np.array([classes.index(path.parent.name) for path in train_files])
        for seed in range(args.seeds):
            last = fit(args, data, seed, scratch / f"{data.name}-{seed}", [])
            scored = Scored(last)
            scored.fit_extra_scores(scored.images(train_files), train_labels)
            inside = scored.scores(scored.images(val_files))
            for kind, folder in (("far", far), ("near", near)):
                outside = scored.scores(scored.images(files_of(folder)[: args.off_domain]))
                table = figures(scored, inside, outside)
                results.setdefault(f"{data.name}/{kind}", []).append(table)
                for score, row in table.items():
                    shares = " | ".join(f"{100 * row[name]:.1f} %" for name in ("fpr95", "unknown", "in_domain_kept"))
                    print(f"| {data.name} | {kind} | {seed} | {score} | {row['auroc']:.3f} | {shares} |", flush=True)
            if position == 0 and seed == 0:
                results["predict_cost_ratio"] = predict_cost(scored, scored.images(val_files[:32]))
    return results


def several_labels(args: argparse.Namespace, scratch: Path, far: Path) -> dict:
    """Mosaics of both sets' photos: the count-constrained thresholds against the F1-best ones, held out."""
    from ..export.run_data import load_run_data  # the run's data, rebuilt from the checkpoint

    results: dict = {}
    csv_path = write_mosaics(args.sets, scratch / "mosaics", args.mosaic_count, seed=0)
    for seed in range(args.seeds):
        last = fit(args, csv_path, seed, scratch / f"mosaics-{seed}", ["--data.test_fraction=0.25"])
        scored = Scored(last)
        data = load_run_data(last, scored.checkpoint, list(scored.model.class_names), None, "the benchmark").datamodule
        validation, test = data.validation_images(), data.held_out_images()
        calibration = scored.calibration
        val_logits, _ = scored.outputs(torch.from_numpy(np.asarray(validation.images[:])))
        test_logits, _ = scored.outputs(torch.from_numpy(np.asarray(test.images[:])))
        val_p, test_p = calibration.probabilities(val_logits), calibration.probabilities(test_logits)
        val_y = torch.from_numpy(np.asarray(validation.labels)).float()
        test_y = torch.from_numpy(np.asarray(test.labels)).float()
        f1_best = best_f1_thresholds(val_p, val_y)
        rules = {"f1_best": f1_best, "count_matched": count_matched_thresholds(val_p, val_y, f1_best)}
        row: dict = {"true_per_image": float(test_y.sum(1).mean())}
        from torchmetrics.functional.classification import multilabel_average_precision

        row["mAP"] = float(multilabel_average_precision(test_p, test_y.long(), num_labels=test_y.shape[1]))
        for name, thresholds in rules.items():
            given = (test_p >= thresholds).float()
            true_positives = float((given * test_y).sum())
            row[f"{name}_given_per_image"] = float(given.sum(1).mean())
            row[f"{name}_micro_f1"] = 2 * true_positives / max(float(given.sum() + test_y.sum()), 1.0)
        digits = scored.images(files_of(far)[: args.off_domain])
        _, far_features = scored.outputs(digits)
        _, test_features = scored.outputs(torch.from_numpy(np.asarray(test.images[:])))
        threshold = float(calibration.domain_threshold)
        far_scores, test_scores = (
            knn_scores(far_features, calibration.bank),
            knn_scores(test_features, calibration.bank),
        )
        row["far_unknown"] = float((far_scores < threshold).float().mean())
        row["test_in_domain"] = float((test_scores >= threshold).float().mean())
        row["far_auroc"] = auroc(test_scores.numpy(), far_scores.numpy())
        print(
            f"| mosaics | {seed} | mAP {row['mAP']:.3f} | given {row['count_matched_given_per_image']:.2f} "
            f"(F1-best {row['f1_best_given_per_image']:.2f}), true {row['true_per_image']:.2f} | micro-F1 "
            f"{row['count_matched_micro_f1']:.3f} (F1-best {row['f1_best_micro_f1']:.3f}) | digits unknown "
            f"{100 * row['far_unknown']:.1f} % | test kept {100 * row['test_in_domain']:.1f} % |",
            flush=True,
        )
        results.setdefault("mosaics", []).append(row)
    return results


def summarize(results: dict) -> dict:
    summary: dict = {}
    for key, runs in results.items():
        if key == "predict_cost_ratio":
            summary[key] = runs
        elif key == "mosaics":
            summary[key] = {name: statistics.mean(run[name] for run in runs) for name in runs[0]}
        else:
            summary[key] = {
                score: {name: statistics.mean(run[score][name] for run in runs) for name in runs[0][score]}
                for score in SCORES
            }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", type=Path, nargs=2, help="two folders of train/ and val/ class folders")
    parser.add_argument("--weights_path", type=Path, help="a local weights file of the config's network (offline)")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--off_domain", type=int, default=200, help="off-domain images per kind, at most")
    parser.add_argument("--mosaics", action="store_true", help="also the several-labels case on 2x2 mosaics")
    parser.add_argument("--mosaic_count", type=int, default=600)
    parser.add_argument("--quick", action="store_true", help="a tiny run that checks the benchmark works")
    args = parser.parse_args()
    args.extra = []
    with tempfile.TemporaryDirectory(prefix="bench-unknown-") as folder:
        scratch = Path(folder)
        if args.quick:
            args.sets, args.epochs, args.seeds, args.off_domain, args.mosaic_count = (
                write_quick_sets(scratch),
                1,
                1,
                20,
                40,
            )
            args.extra = [
                "--model.backbone.name=resnet10t",
                "--model.backbone.pretrained=false",
                "--data.image_size=32",
                "--data.num_workers=0",
            ]
        elif args.sets is None:
            parser.error("--sets is required (or --quick)")
        args.sets = [path.expanduser().resolve() for path in args.sets]
        if args.weights_path:
            args.weights_path = args.weights_path.expanduser().resolve()
        far = write_digits(scratch / "digits")
        print("| set | off-domain | seed | score | AUROC | FPR at 95 % | unknown (own threshold) | in-domain kept |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        results = one_label(args, scratch, far)
        if args.mosaics:
            results |= several_labels(args, scratch, far)
    print(json.dumps(summarize(results)))


if __name__ == "__main__":
    main()
