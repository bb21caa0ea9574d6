"""Is Lightning overhead visible? The project's trainer vs a hand-written PyTorch loop.

Both train the same model (the network of ``--config``, the default config unless told otherwise)
on the same uint8 batches, with the same optimizer, LR schedule, precision and on-device
augmentation, for the same number of steps after a warm-up. The Lightning side also runs the
config's callbacks (histograms, throughput, watchdog, ...; the fast recipe's lookahead) and a
TensorBoard logger. Measured interleaved (A, B, A, B) so machine noise hits both; the last line
is one JSON object with the figures.

    python -m classifier_engine.bench step [--config configs/cifar10_fast.yaml] [--device cpu|cuda] [--quick]
    python -m classifier_engine.bench step --overhead [--device cpu|cuda]   # Lightning's own work per step, in ms

``--overhead`` runs the fast recipe on a network so small (AirBench at width 4, batch 8) that its
arithmetic costs little, so the difference between the two loops is what Lightning, the recipe's
callbacks and the logger add to every step: the median over 5 rounds of the two sides' difference,
in milliseconds per step. Its epochs are
48 batches long, as the recipe's are, so the work done once an epoch is spread as in a real run.

The network and callbacks are built by the project's CLI from the config stacked on the default
one, exactly as ``main.py fit`` would; the optimizer is replaced by a plain SGD at a constant
learning rate (random labels), the same on both sides.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from classifier_engine.cli.trainer_cli import TrainerCLI
from classifier_engine.data.augment import BatchAugment
from classifier_engine.data.cifar_format import CIFAR10

from .project import (
    PACKAGE,
    ImageClassifier,
    project_class,
)

try:  # a data-fitted layer of the fast recipe (a CIFAR project's); a photo project has none
    PatchWhitening: type | None = project_class("models.backbones.PatchWhitening")
except AttributeError:
    PatchWhitening = None

WHITENING_IMAGES = 500
from .project import DEFAULT_CONFIG

FAST_RECIPE = DEFAULT_CONFIG.parent / "cifar10_fast.yaml"
PLAIN_SGD = {
    "class_path": "torch.optim.SGD",
    "init_args": {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.0, "dampening": 0.0},
}


class AugmentedImages(L.LightningDataModule):
    """Fixed random uint8 batches (no disk), augmented on the device as the real DataModule does."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, batch_size: int) -> None:
        super().__init__()
        self.images, self.labels, self.batch_size = images, labels, batch_size
        self.augment = BatchAugment()

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(self.images, self.labels), batch_size=self.batch_size, drop_last=True)

    def train_images(self, count: int) -> torch.Tensor:
        """What WhiteningFit fits a whitening layer to (data.interfaces.TrainingImages)."""
        return self.images[:count]

    def on_after_batch_transfer(self, batch, dataloader_idx):
        if isinstance(batch, torch.Tensor) or not self.trainer.training:
            return batch
        return self.augment(batch[0]), batch[1]


class Recipe:
    """The config's model and callbacks as ``main.py fit`` builds them (checkpointing aside: no files are written)."""

    def __init__(self, args: argparse.Namespace) -> None:
        overrides = [
            f"--model.optimizer={json.dumps(PLAIN_SGD)}",
            f"--model.lr_schedule={PACKAGE}.models.schedules.Constant",
            *([f"--model.backbone.width={args.width}"] if args.width else []),
        ]
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cli = TrainerCLI(
                ImageClassifier,
                default_config=DEFAULT_CONFIG,
                run=False,
                args=["--config", str(args.config), *overrides],
            )
        self.model: ImageClassifier = cli.model
        self.precision = str(cli.config.trainer.precision)
        # The config's callbacks come first in the trainer's list (Lightning appends its own after them).
        configured = cli.config_init.trainer.callbacks[: len(cli.config.trainer.callbacks)]
        self.callbacks = [callback for callback in configured if not isinstance(callback, ModelCheckpoint)]

    def fresh(self) -> tuple[ImageClassifier, list[L.Callback]]:
        """The same freshly initialized model (and unused callbacks) for every round."""
        return copy.deepcopy(self.model), copy.deepcopy(self.callbacks)


def lightning_rate(args, recipe: Recipe, images, labels, steps: int) -> float:
    model, callbacks = recipe.fresh()
    data = AugmentedImages(images, labels, args.batch_size)
    timer = StepTimer(args.warmup)
    with tempfile.TemporaryDirectory() as logs, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = L.Trainer(
            accelerator=args.device,
            devices=1,
            precision=args.precision,
            max_steps=args.warmup + steps,
            logger=L.pytorch.loggers.TensorBoardLogger(logs),
            callbacks=[*callbacks, timer],
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            limit_val_batches=0,
        )
        trainer.fit(model, datamodule=data)
    return timer.images_per_second(args.batch_size)


class StepTimer(L.Callback):
    def __init__(self, warmup: int) -> None:
        self.warmup, self.start, self.steps = warmup, None, 0

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == self.warmup:
            _sync(trainer.strategy.root_device)
            self.start = time.perf_counter()
        elif trainer.global_step > self.warmup:
            self.steps += 1

    def on_train_end(self, trainer, pl_module) -> None:
        _sync(trainer.strategy.root_device)
        self.elapsed = time.perf_counter() - self.start

    def images_per_second(self, batch_size: int) -> float:
        return self.steps * batch_size / self.elapsed


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def plain_rate(args, recipe: Recipe, images, labels, steps: int) -> float:
    device = torch.device(args.device)
    model = recipe.fresh()[0]
    for layer in model.modules():  # the data-fitted start that WhiteningFit makes at fit start
        if PatchWhitening is not None and isinstance(layer, PatchWhitening):
            layer.fit(model.normalize(images[:WHITENING_IMAGES]))
    model = model.to(device)
    model.configure_model()  # torch.compile, when the config asks for it
    optimizer = model.optimizer_factory(model.parameters())
    augment = BatchAugment()
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(args.precision)
    loader = DataLoader(TensorDataset(images, labels), batch_size=args.batch_size, drop_last=True)
    batches = iter(loader)
    model.train()
    start = None
    for step in range(args.warmup + steps):
        if step == args.warmup:
            _sync(device)
            start = time.perf_counter()
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(loader)
            x, y = next(batches)
        x, y = augment(x.to(device, non_blocking=True)), y.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = model.criterion(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    _sync(device)
    return steps * args.batch_size / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="network, callbacks and precision")
    parser.add_argument("--width", type=int, default=None, help="overrides the config's")
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--precision", default=None, help="default: the config's on a GPU, 32-true on a CPU")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="a tiny network and few steps (smoke test)")
    parser.add_argument("--overhead", action="store_true", help="the fast recipe at width 4, batch 8: ms per step")
    args = parser.parse_args()
    if args.overhead:
        if not FAST_RECIPE.is_file():
            parser.exit(
                2,
                f"error: --overhead runs the fast recipe, {FAST_RECIPE.name}, which this project has not; "
                "run it in a CIFAR project, or leave --overhead out\n",
            )
        args.config = FAST_RECIPE
        args.width, args.batch_size, args.warmup, args.steps, args.rounds = 4, 8, 20, 400, 5
    if args.quick:
        args.width, args.batch_size, args.warmup, args.steps, args.rounds = args.width or 8, 32, 1, 3, 1
    recipe = Recipe(args)
    if args.precision is None:
        args.precision = recipe.precision if args.device.startswith("cuda") else "32-true"
    generator = torch.Generator().manual_seed(0)
    # 48 batches an epoch, as the fast recipe's: what Lightning does once an epoch is spread over as many steps.
    count = args.batch_size * (48 if args.overhead else 8)
    images = torch.randint(0, 256, (count, 3, 32, 32), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, len(CIFAR10.class_names), (count,), generator=generator)

    lightning, plain = [], []
    for _ in range(args.rounds):
        lightning.append(lightning_rate(args, recipe, images, labels, args.steps))
        plain.append(plain_rate(args, recipe, images, labels, args.steps))
    result = {"lightning_images_per_s": statistics.median(lightning), "plain_images_per_s": statistics.median(plain)}
    result["lightning_vs_plain"] = result["lightning_images_per_s"] / result["plain_images_per_s"]
    for side in ("lightning", "plain"):
        result[f"{side}_ms_per_step"] = 1e3 * args.batch_size / result[f"{side}_images_per_s"]
    # Each round's two sides ran back to back: the median of their differences cancels slow drifts of the machine.
    rounds = zip(lightning, plain, strict=True)
    result["overhead_ms_per_round"] = [1e3 * args.batch_size * (1 / a - 1 / b) for a, b in rounds]
    result["overhead_ms_per_step"] = statistics.median(result["overhead_ms_per_round"])
    print(f"{'loop':<24}{'images/s':>12}{'ms/step':>10}")
    for label, side in (("Lightning (callbacks)", "lightning"), ("hand-written", "plain")):
        print(f"{label:<24}{result[f'{side}_images_per_s']:>12,.0f}{result[f'{side}_ms_per_step']:>10.3f}")
    print(f"{'ratio / extra per step':<24}{result['lightning_vs_plain']:>12.3f}{result['overhead_ms_per_step']:>10.3f}")
    setup = {key: str(getattr(args, key)) for key in ("config", "device", "batch_size", "precision", "steps")}
    print(json.dumps({**setup, **result}))


if __name__ == "__main__":
    main()
