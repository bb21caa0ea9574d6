"""Your own images: packing rate, and augmented batches from the packed copy vs torchvision's ImageFolder.

Writes a folder of photo-like JPEGs of mixed sizes (``--images``, 200 to 640 px), then, at each
``--sizes`` (64 and 128 px by default):

- packs it once with ``ImageFolderDataModule`` (default processes) and reports images/s;
- measures the delivery rate of augmented training batches: this project's loader over the packed
  copy (uint8 batches, random-resized crop and flip of whole batches on ``--device``; also the uint8
  batches alone, before augmenting) against what a user writes instead,
  ``torchvision.datasets.ImageFolder`` + ``DataLoader`` decoding each JPEG with the same resize and
  centre crop, then ``RandomResizedCrop`` and ``RandomHorizontalFlip`` per image, with the same
  number of workers; interleaved rounds (A, B, A, B, ...) so machine noise hits both, medians reported;
- with ``data.storage: memmap``, the training process's anonymous resident memory (``RssAnon``)
  after reading every batch of an epoch, next to the packed copy's size: the copy is read through
  the memory map, never loaded whole.

The last line is one JSON object with every figure.

    python -m classifier_engine.bench folder [--images 2000] [--sizes 64 128] [--workers 2] [--device cpu|cuda]
        [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

from classifier_engine.data import ImageFolderDataModule


def write_photos(folder: Path, count: int, classes: int = 10) -> None:
    """Smooth colour fields with noise, 200 to 640 px on a side, saved as JPEG like a camera's (quality 90)."""
    rng = np.random.default_rng(0)
    for index in range(count):
        width, height = (int(side) for side in rng.integers(200, 640, 2))
        coarse = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize((width, height), Image.BICUBIC)
        noisy = np.asarray(coarse, dtype=np.int16) + rng.integers(-12, 13, (height, width, 3))
        target = folder / f"class_{index % classes:02d}"
        target.mkdir(parents=True, exist_ok=True)
        Image.fromarray(noisy.clip(0, 255).astype(np.uint8)).save(target / f"{index:06d}.jpg", quality=90)


def rss_anon_mb() -> float:
    """Anonymous resident memory of this process (file-backed pages of a memory map are the page cache's)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def rate(make_batches, device: torch.device) -> float:
    """Images per second over one pass of ``make_batches()`` (after its first batch: worker start-up aside)."""
    images, start = 0, None
    for batch in make_batches():
        if start is None:
            start = time.perf_counter()
            continue
        images += len(batch)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return images / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000, help="JPEGs in the generated folder")
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 128], help="image sizes to pack and serve")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers, for both loaders")
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median is reported")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="a tiny run that checks the benchmark works")
    args = parser.parse_args()
    if args.quick:
        args.images, args.sizes, args.rounds, args.batch_size = 240, [64], 1, 32
    device = torch.device(args.device)
    figures: dict[str, float] = {"images": args.images, "workers": args.workers}
    with tempfile.TemporaryDirectory(prefix="bench-folder-") as scratch:
        photos = Path(scratch) / "photos"
        write_photos(photos, args.images)
        for size in args.sizes:
            data = ImageFolderDataModule(
                image_dir=str(photos),
                image_size=size,
                cache_dir=str(Path(scratch) / "packed"),
                val_fraction=0.05,
                batch_size=args.batch_size,
                num_workers=args.workers,
                storage="memmap",
                pin_memory=False,
            )
            start = time.perf_counter()
            data.prepare_data()
            figures[f"pack_images_per_s_{size}"] = args.images / (time.perf_counter() - start)
            data.setup("fit")
            data.seed = 0

            def ours(data=data):
                for images, _labels, ids in data.train_dataloader():
                    # What on_after_batch_transfer does in training: to the device, then the batch augmentation.
                    yield data.augment(images.to(device, non_blocking=True), ids.to(device), 0)

            def ours_uint8(data=data):
                for images, _labels, _ids in data.train_dataloader():  # what the loader delivers, before augmenting
                    yield images.to(device, non_blocking=True)

            crop = transforms.Compose([transforms.Resize(size), transforms.CenterCrop(size)])
            augment = transforms.Compose(
                [
                    crop,
                    transforms.RandomResizedCrop(size, scale=(0.35, 1.0), antialias=True),
                    transforms.RandomHorizontalFlip(),
                    transforms.PILToTensor(),
                ]
            )
            folder = datasets.ImageFolder(str(photos), transform=augment)

            def theirs(folder=folder):
                loader = DataLoader(folder, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
                for images, _ in loader:
                    yield images.to(device, non_blocking=True)

            rates: dict[str, list[float]] = {"ours": [], "torchvision": [], "uint8": []}
            for _ in range(args.rounds):
                rates["ours"].append(rate(ours, device))
                rates["torchvision"].append(rate(theirs, device))
                rates["uint8"].append(rate(ours_uint8, device))
            ours_rate, theirs_rate, uint8_rate = (statistics.median(values) for values in rates.values())
            figures[f"ours_uint8_{size}"] = uint8_rate
            figures[f"ours_augmented_{size}"] = ours_rate
            figures[f"torchvision_imagefolder_{size}"] = theirs_rate
            figures[f"ours_vs_imagefolder_{size}"] = ours_rate / theirs_rate
            packed_mb = sum(path.stat().st_size for path in data.packed.root.glob("*.npy")) / 2**20
            before = rss_anon_mb()
            train = data.train_set
            for start in range(0, len(train), args.batch_size):  # every training image, through the memory map
                train.__getitems__(range(start, min(start + args.batch_size, len(train))))
            figures[f"packed_mb_{size}"] = packed_mb
            figures[f"rss_anon_growth_mb_{size}"] = max(rss_anon_mb() - before, 0.0)
            print(
                f"{size:>4} px: packed {figures[f'pack_images_per_s_{size}']:8.0f} images/s ({packed_mb:.1f} MB); "
                f"augmented batches: ours {ours_rate:8.0f} images/s, ImageFolder {theirs_rate:8.0f} images/s, "
                f"ratio {ours_rate / theirs_rate:5.1f}x (uint8 batches alone: {uint8_rate:.0f} images/s); "
                "anonymous memory grew "
                f"{figures[f'rss_anon_growth_mb_{size}']:.1f} MB reading the whole copy"
            )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
