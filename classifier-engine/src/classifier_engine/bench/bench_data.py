"""How fast do training batches arrive? This project's loader vs torchvision's per-sample CIFAR10.

Same archive, same batch size, measured interleaved in one run (A, B, A, B, ...) so that machine
noise hits both. Reports images/s for uint8 batch delivery, for delivery plus the training
augmentation (this project: random crop + flip on the device; torchvision: RandomCrop,
RandomHorizontalFlip, ToTensor, Normalize per image in the workers), each for this project's
memory-mapped loader (0 and 2 workers) and its device-resident storage (``data.storage: device``:
the split copied to ``--device`` once, batches gathered there), and the peak resident memory of
the memory-mapped loader with 0 and 2 workers. The last line is one JSON object with every figure.

    python -m classifier_engine.bench data [--data_dir data] [--device cpu|cuda] [--quick]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import numpy as np
import torch
import torchvision
from lightning.fabric.utilities.apply_func import move_data_to_device
from torch.utils.data import DataLoader
from torchvision import transforms

from .project import project_class

CifarDataModule = project_class("data.CifarDataModule")

from classifier_engine.data.cifar_format import CIFAR10
from classifier_engine.testing.cifar_archives import write_archive


class ArchiveCIFAR10(torchvision.datasets.CIFAR10):
    """torchvision's CIFAR10 unchanged, except that it accepts any archive in the official format:
    its per-file MD5 checks are switched off (an MD5 of None means "exists" to torchvision)."""

    train_list: ClassVar[list] = [[name, None] for name, _ in torchvision.datasets.CIFAR10.train_list]
    test_list: ClassVar[list] = [[name, None] for name, _ in torchvision.datasets.CIFAR10.test_list]
    meta: ClassVar[dict] = {**torchvision.datasets.CIFAR10.meta, "md5": None}


def synthetic_archive(folder: Path, count: int) -> Path:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (count, 3, 32, 32), dtype=np.uint8)
    labels = rng.integers(0, 10, count)
    split = count * 5 // 6
    return write_archive(
        folder / CIFAR10.archive_name, CIFAR10, images[:split], labels[:split], images[split:], labels[split:]
    )


def peak_rss_mb() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (own + children) / 1024


def memory_of_loader(data_dir: Path, workers: int, batch_size: int, batches: int) -> float:
    """Peak resident memory (MB) of a process that streams ``batches`` batches with ``workers`` workers."""
    probe = [sys.executable, "-m", __spec__.name, "--memory_probe", str(workers), "--data_dir", str(data_dir)]
    probe += ["--batch_size", str(batch_size), "--batches", str(batches)]
    return float(subprocess.run(probe, capture_output=True, text=True, check=True).stdout.split()[-1])


def memory_probe(data_dir: Path, workers: int, batch_size: int, batches: int) -> None:
    data = CifarDataModule(data_dir=str(data_dir), verify_checksum=False, val_size=0, num_workers=workers)
    data.batch_size = batch_size
    data.setup("fit")
    loader = iter(
        DataLoader(
            data.train_set,
            batch_size=batch_size,
            shuffle=True,
            num_workers=workers,
            collate_fn=data.train_dataloader().collate_fn,
        )
    )
    for _ in range(batches):
        next(loader)
    del loader  # workers exit, so their peak is counted in RUSAGE_CHILDREN
    print(peak_rss_mb())


def rate(loader_factory, batches: int, device: torch.device, deliver) -> float:
    """Images per second over ``batches`` batches, after one warm-up batch (worker start-up)."""
    iterator = iter(loader_factory())
    next(iterator)
    seen, start = 0, time.perf_counter()
    for _ in range(batches):
        images = deliver(move_data_to_device(next(iterator), device))
        seen += images.shape[0]
    if device.type == "cuda":
        torch.cuda.synchronize()
    return seen / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data_dir", type=Path, default=Path("data"), help="folder with cifar-10-python.tar.gz")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch_size", type=int, default=512)
    parser.add_argument("--batches", type=int, default=40, help="batches timed per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median is reported")
    parser.add_argument("--quick", action="store_true", help="a small synthetic archive and few batches (smoke test)")
    parser.add_argument("--memory_probe", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_probe is not None:
        return memory_probe(args.data_dir, args.memory_probe, args.batch_size, args.batches)
    device = torch.device(args.device)
    if args.quick:
        args.batch_size, args.batches, args.rounds = 64, 4, 1

    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        archive = args.data_dir / CIFAR10.archive_name
        if args.quick or not archive.is_file():
            archive = synthetic_archive(scratch, 1200 if args.quick else 30000)
        with tarfile.open(archive) as tar:
            tar.extractall(scratch / "torchvision", filter="data")
        # What the Trainer calls after moving a batch: on_after_batch_transfer (gather, augment).
        # The few trainer attributes it reads are given directly.
        ours_data, resident_data = (
            CifarDataModule(data_dir=str(archive.parent), verify_checksum=False, val_size=0, storage=storage)
            for storage in ("memmap", "device")
        )
        trainer = {"world_size": 1, "global_rank": 0, "current_epoch": 0, "training": False}
        trainer["accumulate_grad_batches"] = 1
        trainer["strategy"] = SimpleNamespace(root_device=device)
        # An epoch from its start: no batches trained before a resume.
        progress = SimpleNamespace(current=SimpleNamespace(ready=0))
        trainer["fit_loop"] = SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress))
        for data in (ours_data, resident_data):
            data.trainer = SimpleNamespace(**trainer)
            data.batch_size = args.batch_size
            data.prepare_data()
            data.setup("fit")
            data.augment.seed(0)

        def delivered(data: CifarDataModule, augmented: bool):
            state = SimpleNamespace(**{**trainer, "training": augmented})

            def deliver(batch):
                data.trainer = state
                return data.on_after_batch_transfer(batch, 0)[0]

            return deliver

        normalize = transforms.Normalize(CIFAR10.mean, CIFAR10.std)
        plain = transforms.PILToTensor()
        augmenting = transforms.Compose(
            [transforms.RandomCrop(32, padding=4), transforms.RandomHorizontalFlip(), transforms.ToTensor(), normalize]
        )

        def ours(data: CifarDataModule, workers: int = 0):
            def loader():
                data.num_workers = workers
                return data.train_dataloader()

            return loader

        def images_only(batch):
            return batch[0]

        def theirs(workers: int, transform):
            dataset = ArchiveCIFAR10(str(scratch / "torchvision"), train=True, transform=transform)
            return lambda: DataLoader(
                dataset,
                batch_size=args.batch_size,
                shuffle=True,
                drop_last=True,
                num_workers=workers,
                persistent_workers=False,
                pin_memory=device.type == "cuda",
            )

        cases = {
            "ours_uint8_w0": (ours(ours_data, 0), delivered(ours_data, False)),
            "ours_uint8_w2": (ours(ours_data, 2), delivered(ours_data, False)),
            "ours_augmented_w2": (ours(ours_data, 2), delivered(ours_data, True)),
            "ours_resident_uint8": (ours(resident_data), delivered(resident_data, False)),
            "ours_resident_augmented": (ours(resident_data), delivered(resident_data, True)),
            "torchvision_uint8_w0": (theirs(0, plain), images_only),
            "torchvision_uint8_w2": (theirs(2, plain), images_only),
            "torchvision_augmented_w0": (theirs(0, augmenting), images_only),
            "torchvision_augmented_w2": (theirs(2, augmenting), images_only),
        }
        samples: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.rounds):
            for name, (factory, deliver) in cases.items():
                samples[name].append(rate(factory, args.batches, device, deliver))
        result = {name: statistics.median(values) for name, values in samples.items()}

        # Each in a fresh process: peak memory of the loader alone (itself plus its workers).
        memory = {
            f"ours_peak_rss_mb_w{workers}": memory_of_loader(archive.parent, workers, args.batch_size, args.batches)
            for workers in (0, 2)
        }

    best_theirs_uint8 = max(result["torchvision_uint8_w0"], result["torchvision_uint8_w2"])
    best_theirs_aug = max(result["torchvision_augmented_w0"], result["torchvision_augmented_w2"])
    ratios = {
        "uint8_delivery_vs_torchvision": max(result["ours_uint8_w0"], result["ours_uint8_w2"]) / best_theirs_uint8,
        "augmented_vs_torchvision": result["ours_augmented_w2"] / best_theirs_aug,
        "resident_uint8_vs_torchvision": result["ours_resident_uint8"] / best_theirs_uint8,
        "resident_augmented_vs_torchvision": result["ours_resident_augmented"] / best_theirs_aug,
    }
    print(f"{'loader':<28}{'images/s':>14}")
    for name, value in result.items():
        print(f"{name:<28}{value:>14,.0f}")
    for name, value in {**ratios, **memory}.items():
        print(f"{name:<34}{value:>10.2f}")
    print(json.dumps({"device": str(device), "batch_size": args.batch_size, **result, **ratios, **memory}))


if __name__ == "__main__":
    sys.exit(main())
