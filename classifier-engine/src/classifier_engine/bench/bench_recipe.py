"""The fast recipe's accuracy and time under airbench's timing rules, optionally beside airbench94's own script.

    python -m classifier_engine.bench recipe [--config configs/cifar10_fast.yaml] [--seeds 5] [--device cuda|cpu]
        [--data_dir data] [--reference PATH/TO/airbench94.py] [--per_epoch_validation] [--quick]

Each seed trains the config once through the project's own objects (``TrainerCLI(run=False)`` and
``trainer.fit``, exactly the callbacks, logger and checkpoints of ``main.py fit``, written to a
temporary folder) and is timed as airbench times itself:

- first one warm-up run of 20 steps on each side (cuDNN autotuning, compilation, first-touch
  allocations), its final evaluation included: not counted;
- the images in memory on the device (``data.storage: device``), as airbench keeps them;
- counted: from the whitening fit (the first thing after the data is in memory) to the end of
  training, the final evaluation of the last weights with the config's test-time views included;
- not counted: process start, imports, building the objects, loading the data into memory, and the
  per-epoch evaluations (reported on their own). By default there are none: the run validates only
  its final weights (``trainer.check_val_every_n_epoch`` set to ``trainer.max_epochs``; the same
  switch works on the command line of ``main.py fit``); ``--per_epoch_validation`` keeps them.

On CUDA the marks are CUDA events, read after a synchronize at the end, as airbench does; on a CPU
they are ``time.perf_counter()``.

``--reference`` runs airbench94's own ``main()`` from a file you have (``legacy/airbench94.py`` of
https://github.com/KellerJordan/cifar10-airbench; nothing is downloaded) on the same device and the
same images (the archive converted to the ``cifar10/train.pt`` and ``test.pt`` it reads), seeded
the same, interleaved with the project's runs seed by seed. On CUDA it runs unchanged (fp16). On a
CPU only its device and dtype lines are adapted (``.cuda()``, ``torch.cuda.Event``,
``torch.cuda.synchronize``, the load's ``map_location``, ``.half()`` -> fp32), and the output says so.
The last line is one JSON object with the figures.

``--quick`` (what the tests run; a smoke test on any data) trains a width-4 network for 2 epochs of 4 steps of 32
images and evaluates a few batches; on the reference
it sets the same batch size, width and about as many steps through airbench's ``hyp`` dictionary.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import types
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from io import StringIO
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch

from classifier_engine.cli.trainer_cli import TrainerCLI
from classifier_engine.data.archive import prepare
from classifier_engine.data.cifar_format import CIFAR10
from classifier_engine.foundation.errors import OneLineArgumentParser, exit_with

from .project import (
    DEFAULT_CONFIG,
    PROJECT_ROOT,
    ImageClassifier,
)

FAST_RECIPE = PROJECT_ROOT / "configs" / "cifar10_fast.yaml"
# Two epochs of 4 batches whatever the data's size (the tests' tiny archive or the full CIFAR-10), a few evaluation
# batches: the final weights are validated at the end of the last epoch, as in a full run.
QUICK = [
    "--trainer.max_steps=8",
    "--trainer.max_epochs=2",
    "--trainer.limit_train_batches=4",
    "--trainer.limit_val_batches=2",
    "--trainer.limit_test_batches=2",
    "--data.global_batch_size=32",
]
QUICK_WIDTH = 4
WARMUP_STEPS = 20  # each side's warm-up run (2 with --quick)
# airbench94.py's device and dtype lines, and what they become on a CPU (fp32).
CPU_ADAPTATIONS = {
    "map_location=torch.device(gpu)": "map_location='cpu'",
    "torch.cuda.Event(enable_timing=True)": "_HostEvent()",
    "torch.cuda.synchronize()": "pass",
    ".half()": ".float()",
    ".cuda()": "",
}


class RecipeClock(L.Callback):
    """Marks the fit's start (first callback's ``setup``: the data is loaded, nothing else has run), each
    validation's start and end, and the end of training; seconds are read once, after the fit."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.marks: list[tuple[str, Any]] = []
        self.validated_at: list[int] = []

    def _mark(self, name: str) -> None:
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append((name, event))
        else:
            self.marks.append((name, time.perf_counter()))

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._mark("start")

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.validated_at.append(trainer.global_step)
        self._mark("validation")

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._mark("training")

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._mark("end")

    def seconds(self) -> dict[str, float]:
        """Counted seconds, and those of the per-epoch evaluations and of the final one."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            start = self.marks[0][1]
            times = [0.0] + [1e-3 * start.elapsed_time(event) for _, event in self.marks[1:]]
        else:
            times = [moment - self.marks[0][1] for _, moment in self.marks]
        validations = [times[i + 1] - times[i] for i, (name, _) in enumerate(self.marks[:-1]) if name == "validation"]
        per_epoch, final = sum(validations[:-1]), (validations[-1] if validations else 0.0)
        return {"counted_s": times[-1] - per_epoch, "per_epoch_eval_s": per_epoch, "final_eval_s": final}


class _HostEvent:
    """``torch.cuda.Event``'s timing interface on the host clock (airbench94 on a CPU)."""

    def record(self) -> None:
        self.moment = time.perf_counter()

    def elapsed_time(self, end: _HostEvent) -> float:
        return 1e3 * (end.moment - self.moment)


@contextmanager
def working_directory(path: Path) -> Iterator[None]:
    previous = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


def warmup_steps(args: argparse.Namespace) -> int:
    return 2 if args.quick else WARMUP_STEPS


def project_run(args: argparse.Namespace, seed: int, warmup: bool = False) -> dict[str, float]:
    """One ``fit`` of the config, timed; ``warmup``: a short one that validates at its end (nothing kept)."""
    device = torch.device(args.device)
    options = [
        "--config",
        str(args.config),
        f"--seed_everything={seed}",
        f"--data.data_dir={args.data_dir}",
        f"--trainer.accelerator={'gpu' if device.type == 'cuda' else device.type}",
        "--trainer.devices=1",
        *([f"--trainer.precision={args.precision}"] if args.precision else []),
        "--data.storage=device",  # in memory on the device, as airbench keeps it (the recipe's auto on a GPU)
        "--trainer.num_sanity_val_steps=0",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        *([*QUICK, f"--model.backbone.init_args.width={QUICK_WIDTH}"] if args.quick else []),
        *([f"--trainer.max_steps={warmup_steps(args)}"] if warmup else []),
        *args.options,
    ]
    with tempfile.TemporaryDirectory() as folder, working_directory(Path(folder)), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cli = TrainerCLI(ImageClassifier, default_config=DEFAULT_CONFIG, run=False, args=options)
        trainer = cli.trainer
        if warmup:
            trainer.check_val_every_n_epoch = 1
        elif not args.per_epoch_validation:  # = --trainer.check_val_every_n_epoch <max_epochs>
            trainer.check_val_every_n_epoch = trainer.max_epochs
        clock = RecipeClock(device)
        trainer.callbacks.insert(0, clock)
        trainer.fit(cli.model, datamodule=cli.datamodule)
        if trainer.max_steps > 0 and (not clock.validated_at or clock.validated_at[-1] != trainer.global_step):
            raise SystemExit(
                f"error: the run ended at step {trainer.global_step} without validating its final weights; "
                "make trainer.max_steps end inside the last of trainer.max_epochs"
            )
        return {**clock.seconds(), "top1": float(trainer.callback_metrics["val/top1"])}


def write_airbench_data(data_dir: Path, folder: Path) -> int:
    """The archive's images as the ``cifar10/train.pt`` and ``test.pt`` airbench94 loads (NHWC uint8);
    returns the number of training images."""
    cache = prepare(data_dir, CIFAR10, download=False, verify_checksum=False)
    (folder / "cifar10").mkdir()
    counts = {}
    for split, file_name in (("train", "train.pt"), ("test", "test.pt")):
        paths = cache.split(split)
        images = torch.from_numpy(np.ascontiguousarray(np.load(paths.images).transpose(0, 2, 3, 1)))
        labels = torch.from_numpy(np.load(paths.labels))
        data = {"images": images, "labels": labels, "classes": list(cache.class_names)}
        torch.save(data, folder / "cifar10" / file_name)
        counts[split] = len(labels)
    return counts["train"]


def load_airbench(path: Path, device: torch.device, quick: bool) -> tuple[types.ModuleType, list[str]]:
    """airbench94.py as a module, adapted to a CPU where needed; what was changed, in words."""
    source = path.read_text()
    changes = []
    if device.type != "cuda":
        for old, new in CPU_ADAPTATIONS.items():
            if old in source:
                changes.append(f"{source.count(old)} x {old} -> {new or '(removed)'}")
                source = source.replace(old, new)
        leftover = [line.strip() for line in source.splitlines() if "cuda" in line and "cudnn" not in line]
        if leftover:
            raise SystemExit(f"error: {path} still uses CUDA on a CPU ({leftover[0]}); use --device cuda")
    module = types.ModuleType("airbench94")
    module.__file__ = str(path)
    module.__dict__["_HostEvent"] = _HostEvent
    try:
        exec(compile(source, str(path), "exec"), module.__dict__)
    except Exception as error:  # not a Python file, or one that fails at import
        reason = f"{type(error).__name__}: {error}"
        raise SystemExit(f"error: {path} fails to load ({reason}); is it airbench94.py?") from None
    if not hasattr(module, "main") or not hasattr(module, "hyp"):
        raise SystemExit(f"error: {path} has no main() and hyp: is it airbench94.py?")
    if quick:
        module.hyp["opt"].update(batch_size=32, train_epochs=1.4)
        module.hyp["net"]["widths"] = dict.fromkeys(("block1", "block2", "block3"), QUICK_WIDTH)
        changes.append("--quick: hyp batch_size 32, train_epochs 1.4, widths 4")
    return module, changes


def reference_run(
    airbench: types.ModuleType, folder: Path, seed: int, warmup_epochs: float | None = None
) -> dict[str, float]:
    """airbench94's ``main(seed)``; its own counted time, from the final row it would print.

    ``warmup_epochs``: a short run of that many epochs (its own ``main("warmup")`` would train all of
    them: 40 minutes on a 2-core CPU), with the same shapes, the final evaluation included.
    """
    final: dict[str, Any] = {}

    def keep_final(variables: dict[str, Any], is_final_entry: bool) -> None:
        if is_final_entry:
            final.update(variables)

    airbench.print_training_details = keep_final
    options = airbench.hyp["opt"]
    epochs = options["train_epochs"]
    if warmup_epochs is not None:
        options["train_epochs"] = warmup_epochs
    torch.manual_seed(seed)
    try:
        with working_directory(folder), redirect_stdout(StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            accuracy = airbench.main(seed)
    finally:
        options["train_epochs"] = epochs
    return {"counted_s": float(final["total_time_seconds"]), "top1": float(accuracy)}


def summary(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def main() -> None:
    parser = OneLineArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=FAST_RECIPE)
    parser.add_argument("--seeds", type=int, default=5, help="runs of each side (seeds 0, 1, ...)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--data_dir", type=Path, default=Path("data"), help="the folder of cifar-10-python.tar.gz")
    parser.add_argument("--precision", default=None, help="default: the config's on a GPU, 32-true on a CPU")
    parser.add_argument("--reference", type=Path, default=None, help="airbench94.py, run beside the recipe")
    parser.add_argument("--per_epoch_validation", action="store_true", help="validate after every epoch too")
    parser.add_argument("--quick", action="store_true", help="a tiny network for a few steps (smoke test)")
    args, args.options = parser.parse_known_args()  # the rest goes to the config (e.g. --model.compile true)
    if args.seeds < 1:
        parser.error(f"--seeds must be at least 1, got {args.seeds}")
    if not args.config.is_file():
        parser.error(f"--config {args.config}: no such file; give a config of configs/")
    # Each run works in a temporary folder (its logs and checkpoints go there): paths are made absolute first.
    args.config, args.data_dir = args.config.resolve(), args.data_dir.resolve()
    if args.reference is not None and not args.reference.is_file():
        parser.error(f"--reference {args.reference}: no such file; give the path of airbench94.py")
    if args.precision is None and not args.device.startswith("cuda"):
        args.precision = "32-true"  # bf16 on a CPU is emulated: slower than fp32
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here; use --device cpu")

    airbench = None
    if args.reference is not None:
        airbench, changes = load_airbench(args.reference, torch.device(args.device), args.quick)
        print(f"airbench94 from {args.reference}: " + ("; ".join(changes) if changes else "unchanged"))
    rows: dict[str, list[dict[str, float]]] = {"project": [], "airbench94": []}
    with tempfile.TemporaryDirectory() as airbench_folder:
        print("warm-up runs (not counted) ...")
        project_run(args, seed=0, warmup=True)  # also checks and converts the archive, as main.py fit does
        if airbench is not None:
            images = write_airbench_data(args.data_dir, Path(airbench_folder))
            epochs = warmup_steps(args) * airbench.hyp["opt"]["batch_size"] / images  # as many steps as the project's
            reference_run(airbench, Path(airbench_folder), seed=0, warmup_epochs=epochs)
        for seed in range(args.seeds):
            rows["project"].append(project_run(args, seed))
            if airbench is not None:
                rows["airbench94"].append(reference_run(airbench, Path(airbench_folder), seed))
            latest = [
                f"{side} {runs[-1]['top1']:.4f} in {runs[-1]['counted_s']:.2f} s" for side, runs in rows.items() if runs
            ]
            print(f"seed {seed}: " + ", ".join(latest))

    precision = args.precision or "the config's"
    result: dict[str, Any] = {"config": str(args.config), "device": args.device, "precision": precision}
    result["seeds"] = args.seeds
    print(f"{'side':<12}{'top-1 (TTA)':>20}{'counted s':>18}{'per-epoch evals s':>20}")
    for side, runs in rows.items():
        if not runs:
            continue
        top1, seconds = summary([run["top1"] for run in runs]), summary([run["counted_s"] for run in runs])
        evals = f"{statistics.mean(run['per_epoch_eval_s'] for run in runs):.2f}" if side == "project" else "-"
        print(f"{side:<12}{top1[0]:>12.4f} ± {top1[1]:.4f}{seconds[0]:>10.2f} ± {seconds[1]:.2f}{evals:>20}")
        result.update({f"{side}_top1": top1[0], f"{side}_top1_std": top1[1], f"{side}_s": seconds[0]})
        result[f"{side}_s_std"] = seconds[1]
    result["project_per_epoch_eval_s"] = statistics.mean(run["per_epoch_eval_s"] for run in rows["project"])
    result["project_final_eval_s"] = statistics.mean(run["final_eval_s"] for run in rows["project"])
    if rows["airbench94"]:
        result["time_vs_airbench94"] = result["project_s"] / result["airbench94_s"]
        result["top1_minus_airbench94"] = result["project_top1"] - result["airbench94_top1"]
        print(
            f"project / airbench94: time x{result['time_vs_airbench94']:.3f}, "
            f"top-1 {100 * result['top1_minus_airbench94']:+.2f} points"
        )
    print(json.dumps(result))


if __name__ == "__main__":
    try:
        main()
    except Exception as error:  # a mistake (missing archive, bad option) is one line; a bug is a traceback
        exit_with(error)
