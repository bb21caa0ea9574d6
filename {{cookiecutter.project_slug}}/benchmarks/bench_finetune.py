"""The fine-tuning preset against a plain fine-tune of the same network, on the same photos, in one run.

    python benchmarks/bench_finetune.py --image_dir photos/ [--network resnet50.a1_in1k] [--weights_path FILE]
        [--epochs 10] [--image_size 224] [--batch_size 64] [--seeds 3] [--device auto|cuda|cpu] [--quick]

Both arms are ordinary ``main.py fit`` runs on ``configs/images.yaml``, from the same pretrained
weights, for the same epochs and batch, each seed run on both arms in turn:

- **plain**: what most tutorials do (PyTorch's transfer-learning tutorial): every layer trains from the
  first step with SGD at lr 0.001, momentum 0.9 and a constant rate, plain cross-entropy, the
  project's random-resized crop and flip, the last weights evaluated on one view;
- **recipe**: ``configs/presets/finetune.yaml`` as shipped (head first, the body at a tenth of the
  rate, warm-up and cosine, label smoothing, stochastic depth, MixUp, the weights' moving average,
  test-time flip).

Each run validates on the same held-out images (the folder's split, seeded by data.split_seed). It
prints a table of each run's final validation top-1 and its time, and as its last line one JSON
object: each arm's mean top-1 and the recipe's gain in points. The weights come from the Hugging Face
cache (``HF_HUB_OFFLINE=1`` works once they are there) or ``--weights_path``.

``--quick`` (what the tests run) checks the script works: generated photos, a small timm network from
random weights, 32 px, one epoch; its figures mean nothing.
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
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

PROJECT = Path(__file__).resolve().parents[1]
TIMM_NET = "{{ cookiecutter.import_name }}.models.backbones.TimmNet"
PLAIN = [
    "--model.optimizer=torch.optim.SGD",
    "--model.optimizer.lr=0.001",
    "--model.optimizer.momentum=0.9",
    "--model.optimizer.nesterov=false",
    "--model.optimizer.weight_decay=0.0001",
    "--model.lr_schedule={{ cookiecutter.import_name }}.models.schedules.Constant",
    "--model.label_smoothing=0.0",
]
RECIPE = ["--config", str(PROJECT / "configs" / "presets" / "finetune.yaml")]


def write_photos(folder: Path, per_class: int = 24) -> None:
    """Generated stand-ins for photos: three classes of noisy colour fields of mixed sizes (for --quick)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for label, colour in enumerate(((200, 60, 60), (60, 200, 60), (60, 60, 200))):
        (folder / f"class_{label}").mkdir(parents=True, exist_ok=True)
        for index in range(per_class):
            height, width = rng.integers(40, 90, size=2)
            pixels = np.clip(rng.normal(colour, 40, size=(height, width, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(folder / f"class_{label}" / f"{index}.jpg", quality=90)


def final_top1(run_dir: Path) -> float:
    """The run's last logged val/top1 (its final weights, averaged where the recipe averages them)."""
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return events.Scalars("val/top1")[-1].value


def train(arm: str, common: list[str], seed: int, scratch: Path, device: str) -> tuple[float, float]:
    """One ``main.py fit`` run of ``arm``; returns (final val/top1, seconds)."""
    root = scratch / f"{arm}-{seed}"
    root.mkdir()
    extra = PLAIN if arm == "plain" else RECIPE
    command = [sys.executable, str(PROJECT / "main.py"), "fit", "--config", str(PROJECT / "configs" / "images.yaml"),
               *extra, *common, f"--seed_everything={seed}", f"--trainer.accelerator={device}",
               "--trainer.enable_progress_bar=false"]  # fmt: skip
    start = time.perf_counter()
    result = subprocess.run(command, cwd=root, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"error: the {arm} run (seed {seed}) failed: {result.stderr.strip().splitlines()[-1]}")
    (run_dir,) = {path.parent for path in root.glob("runs/images/*/events.out.tfevents.*")}
    return final_top1(run_dir), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image_dir", type=Path, help="your photos (class folders, as main.py takes them)")
    parser.add_argument("--network", default="resnet50.a1_in1k", help="a timm name with its weights' tag")
    parser.add_argument("--weights_path", type=Path, help="a local weights file of that network (offline)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--device", default="auto", help="trainer.accelerator for both arms")
    parser.add_argument("--quick", action="store_true", help="a tiny run that checks the benchmark works")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-finetune-") as folder:
        scratch = Path(folder)
        network = [f"--model.backbone={TIMM_NET}", f"--model.backbone.name={args.network}"]
        if args.quick:
            args.image_dir, args.network, args.epochs, args.image_size = scratch / "photos", "resnet10t", 1, 32
            args.batch_size, args.seeds = 8, 1
            write_photos(args.image_dir)
            network = [f"--model.backbone={TIMM_NET}", f"--model.backbone.name={args.network}"]
            network.append("--model.backbone.pretrained=false")
        elif args.image_dir is None:
            parser.error("--image_dir is required (or --quick)")
        if args.weights_path:
            network.append(f"--model.backbone.weights_path={args.weights_path.expanduser().resolve()}")
        common = [
            f"--data.image_dir={args.image_dir.expanduser().resolve()}",
            f"--data.cache_dir={scratch / 'packed'}",  # packed once, shared by every run
            f"--data.image_size={args.image_size}",
            f"--data.batch_size={args.batch_size}",
            f"--trainer.max_epochs={args.epochs}",
            *network,
        ]
        results: dict[str, list[float]] = {"plain": [], "recipe": []}
        print("| arm | seed | val top-1 | minutes |\n| --- | --- | --- | --- |")
        for seed in range(args.seeds):
            for arm in results:
                top1, seconds = train(arm, common, seed, scratch, args.device)
                results[arm].append(top1)
                print(f"| {arm} | {seed} | {100 * top1:.2f} % | {seconds / 60:.1f} |", flush=True)
    plain, recipe = (statistics.mean(results[arm]) for arm in ("plain", "recipe"))
    summary = {
        **{key: getattr(args, key) for key in ("network", "epochs", "image_size", "batch_size", "seeds")},
        "plain_top1": plain,
        "recipe_top1": recipe,
        "recipe_minus_plain_points": 100 * (recipe - plain),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
