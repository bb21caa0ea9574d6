"""The default fine-tune against its own linear probe, fastai's ``fine_tune`` and plain recipes, on the same weights.

    python -m classifier_engine.bench finetune --image_dir photos/ [--network NAME] [--weights_path FILE]
        [--epochs 5] [--seeds 3] [--device auto|cuda|cpu] [--fastai_python PATH] [--quick]

``image_dir`` holds ``train/`` and ``val/`` folders of class folders (the scripts read them as
``ImageFolder``s). The arms, at the same epochs, from the same pretrained weights, each seed run on every
arm in turn:

- **default**: ``python main.py fit --config configs/images.yaml`` as shipped: the linear probe first, then
  the recipe that fits the folder, the better of the two kept;
- **probe**: ``fit --recipe probe``: the linear probe alone (a logistic regression on the frozen features,
  its L2 strength chosen on folds of the training images), the strongest simple baseline;
- **plain**: the same pipeline with PyTorch's transfer-learning tutorial's recipe: every layer trains
  from the first step with SGD at lr 0.001, momentum 0.9 and a constant rate, batch 32, plain
  cross-entropy, timm's random head, no probe, no average, the last weights evaluated on one view;
- **script**: ``classifier_engine/bench/plain_finetune.py``, the same recipe as a timm + torchvision
  ``ImageFolder`` + ``DataLoader`` script a user writes, which knows nothing of this project;
- **fastai** (with ``--fastai_python``, the Python of an environment where fastai is installed; it is not
  a dependency of the project): ``bench/fastai_finetune.py``, fastbook's recipe for a small folder,
  ``vision_learner(...).fine_tune(epochs - 1, freeze_epochs=1)``.

It prints a table of each run's final validation top-1 and its CPU seconds (the whole command, the
one-time packing of the pipeline's first run included), and as its last line one JSON object: each arm's
mean and standard deviation of top-1 and CPU seconds, and the default's lead over the probe and over
fastai in points. The weights come from the Hugging Face cache (``HF_HUB_OFFLINE=1`` works once they are
there) or ``--weights_path``.

``--quick`` (what the tests run) checks the script works: generated photos, a small timm network from
random weights, 32 px, two epochs; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from .project import PACKAGE
from .project import PROJECT_ROOT as PROJECT

IMAGES_CONFIG = PROJECT / "configs" / "images.yaml"
SCRIPT = Path(__file__).resolve().parent / "plain_finetune.py"
FASTAI_SCRIPT = Path(__file__).resolve().parent / "fastai_finetune.py"
ARMS = ("default", "probe", "plain", "script", "fastai")
PLAIN = [
    "--model.optimizer=torch.optim.SGD",
    "--model.optimizer.lr=0.001",
    "--model.optimizer.momentum=0.9",
    "--model.optimizer.nesterov=false",
    "--model.optimizer.weight_decay=0",
    "--model.optimizer.fused=false",
    f"--model.lr_schedule={PACKAGE}.models.schedules.Constant",
    "--model.label_smoothing=0.0",
    "--model.backbone_lr_scale=1.0",
    "--model.backbone.head_init=timm",
    "--model.test_time_augmentation=null",
    "--data.batch_size=32",
    "--data.mixup_alpha=0.0",
    "--trainer.callbacks=[]",  # no probe, no head-first epoch, no weight average (nor the logging callbacks)
]


def write_photos(folder: Path, per_class: int = 12) -> None:
    """Generated stand-ins for photos in train/ and val/: three classes of noisy colour fields (for --quick)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in (("train", per_class), ("val", per_class // 2)):
        for label, colour in enumerate(((200, 60, 60), (60, 200, 60), (60, 60, 200))):
            (folder / split / f"class_{label}").mkdir(parents=True, exist_ok=True)
            for index in range(count):
                height, width = rng.integers(40, 90, size=2)
                pixels = np.clip(rng.normal(colour, 40, size=(height, width, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / split / f"class_{label}" / f"{index}.jpg", quality=90)


def write_random_weights(network: str, path: Path) -> Path:
    """A weights file of ``network`` from random initialization (for --quick: the route, not the accuracy)."""
    import timm
    import torch

    torch.manual_seed(0)
    torch.save(timm.create_model(network).state_dict(), path)
    return path


def read_run(run_dir: Path) -> float:
    """The last val/top1 of a pipeline run (its final validation: the model it ships)."""
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return events.Scalars("val/top1")[-1].value


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def train(arm: str, args: argparse.Namespace, seed: int, scratch: Path) -> tuple[float, float]:
    """One run of ``arm``; returns (final val top-1, CPU seconds of the command)."""
    root = scratch / f"{arm}-{seed}"
    root.mkdir()
    weights = [f"--weights_path={args.weights_path}"] if args.weights_path else []
    folders = [f"--train_dir={args.image_dir / 'train'}", f"--val_dir={args.image_dir / 'val'}"]
    if arm in ("script", "fastai"):
        python, script = (sys.executable, SCRIPT) if arm == "script" else (args.fastai_python, FASTAI_SCRIPT)
        command = [
            str(python),
            str(script),
            *folders,
            f"--network={args.network}",
            f"--epochs={args.epochs}",
            f"--seed={seed}",
            *weights,
            *args.script_extra,
        ]
    else:
        recipe = {"plain": PLAIN, "probe": ["--recipe=probe"]}.get(arm, [])
        command = [
            sys.executable,
            str(PROJECT / "main.py"),
            "fit",
            "--config",
            str(IMAGES_CONFIG),
            *recipe,
            f"--model.backbone.name={args.network}",
            *[f"--model.backbone.{option.lstrip('-')}" for option in weights],
            *args.pipeline_extra,
            f"--data.image_dir={args.image_dir}",
            f"--data.cache_dir={scratch / 'packed'}",
            f"--trainer.max_epochs={args.epochs}",
            f"--seed_everything={seed}",
            f"--trainer.accelerator={args.device}",
            "--trainer.enable_progress_bar=false",
        ]
    before = children_cpu_seconds()
    result = subprocess.run(command, cwd=root, capture_output=True, text=True)
    cpu_seconds = children_cpu_seconds() - before
    if result.returncode != 0:
        sys.exit(f"error: the {arm} run (seed {seed}) failed: {(result.stderr.strip().splitlines() or ['?'])[-1]}")
    if arm in ("script", "fastai"):
        return json.loads(result.stdout.strip().splitlines()[-1])["val_top1"][-1], cpu_seconds
    (run_dir,) = {path.parent for path in root.glob("runs/images/*/events.out.tfevents.*")}
    return read_run(run_dir), cpu_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image_dir", type=Path, help="train/ and val/ folders of class folders of photos")
    parser.add_argument("--network", default="tf_efficientnet_lite1.in1k", help="a timm name with its weights' tag")
    parser.add_argument("--weights_path", type=Path, help="a local weights file of that network (offline)")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--device", default="auto", help="trainer.accelerator of the pipeline's arms")
    parser.add_argument("--fastai_python", type=Path, help="the Python of an environment with fastai: its arm runs")
    parser.add_argument("--arms", default=",".join(ARMS), help="which arms to run, comma-separated")
    parser.add_argument("--quick", action="store_true", help="a tiny run that checks the benchmark works")
    args = parser.parse_args()
    args.pipeline_extra, args.script_extra = [], []
    with tempfile.TemporaryDirectory(prefix="bench-finetune-") as folder:
        scratch = Path(folder)
        if args.quick:
            args.image_dir, args.network, args.epochs, args.seeds = scratch / "photos", "resnet10t", 2, 1
            write_photos(args.image_dir)
            args.weights_path = write_random_weights(args.network, scratch / "weights.pth")  # no download
            args.pipeline_extra = ["--data.image_size=32", "--data.num_workers=0"]
            args.script_extra = ["--image_size=32", "--workers=0"]
        elif args.image_dir is None:
            parser.error("--image_dir is required (or --quick)")
        args.image_dir = args.image_dir.expanduser().resolve()
        if args.weights_path:
            args.weights_path = args.weights_path.expanduser().resolve()
        arms = [arm for arm in args.arms.split(",") if arm != "fastai" or args.fastai_python]
        if unknown := set(arms) - set(ARMS):
            parser.error(f"--arms: unknown {sorted(unknown)}; choose among {', '.join(ARMS)}")
        results: dict[str, list[tuple[float, float]]] = {arm: [] for arm in arms}
        print("| arm | seed | val top-1 | CPU seconds |\n| --- | --- | --- | --- |")
        for seed in range(args.seeds):
            for arm in arms:
                top1, seconds = train(arm, args, seed, scratch)
                results[arm].append((top1, seconds))
                print(f"| {arm} | {seed} | {100 * top1:.2f} % | {seconds:.0f} |", flush=True)
    summary: dict[str, object] = {"network": args.network, "epochs": args.epochs, "seeds": args.seeds}
    for arm, runs in results.items():
        tops, seconds = [top for top, _ in runs], [second for _, second in runs]
        summary[f"{arm}_top1"] = statistics.mean(tops)
        summary[f"{arm}_top1_sd"] = statistics.stdev(tops) if len(tops) > 1 else 0.0
        summary[f"{arm}_cpu_seconds"] = statistics.mean(seconds)
    for other in ("probe", "fastai", "script"):
        if "default" in results and other in results:
            summary[f"default_minus_{other}_points"] = 100 * (summary["default_top1"] - summary[f"{other}_top1"])
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
