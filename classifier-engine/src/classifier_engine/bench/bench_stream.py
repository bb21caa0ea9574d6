"""Your own images streamed with litdata (from an S3 server, from a local copy) vs the memory map and ImageFolder.

Writes a folder of photo-like JPEGs (``--images``, 200 to 640 px, as ``bench_folder.py``), then, at each
``--sizes`` (64 and 224 px by default), packs it twice with ``pack.py`` (the images per item it picks
for the size): into a local S3-compatible server (``moto``, on localhost) and into a local folder. It
then measures the uint8 training batches each source delivers, with the same batch size and workers:

- litdata from S3, each round with an empty cache (every chunk downloaded: a first epoch), and again
  with the cache that round filled (a later epoch);
- litdata from the local copy;
- this project's memory map of the same images (``ImageFolderDataModule``);
- ``torchvision.datasets.ImageFolder`` + ``DataLoader``, decoding each JPEG with the same resize and
  centre crop.

Rounds are interleaved (A, B, C, ...) so machine noise hits every source; medians are reported, with
each rate's ratio to ImageFolder's. The server is on this machine: the figures say what litdata's
reader and cache cost, not what a network adds. The last line is one JSON object with every figure.

    python -m classifier_engine.bench stream [--images 1000] [--sizes 64 224] [--workers 2] [--quick]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

from classifier_engine.data import ImageFolderDataModule, StreamedImageDataModule
from classifier_engine.foundation.noise import silence_known_noise

from .bench_folder import rate, write_photos
from .project import PROJECT_ROOT


def start_store() -> tuple[object, dict[str, str]]:
    """A moto S3 server on localhost with a bucket, and the variables that reach it (as for a real endpoint)."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    client = boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
    )
    client.create_bucket(Bucket="bench")
    return server, env


def pack(photos: Path, size: int, output: str, env: dict[str, str]) -> None:
    command = [
        sys.executable,
        str(PROJECT_ROOT / "pack.py"),
        f"--data.image_dir={photos}",
        f"--data.image_size={size}",
        "--data.val_fraction=0.05",
        f"--output={output}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **env})
    if result.returncode != 0:
        raise SystemExit(result.stderr[-2000:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=1000, help="JPEGs in the generated folder")
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 224], help="image sizes to pack and serve")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers, for every source")
    parser.add_argument("--batch_size", type=int, default=64, help="images per batch (a multiple of images per item)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median is reported")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="where batches go")
    parser.add_argument("--quick", action="store_true", help="a tiny run that checks the benchmark works")
    args = parser.parse_args()
    if args.quick:
        args.images, args.sizes, args.rounds, args.batch_size = 160, [64], 1, 16
    silence_known_noise()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # the server's line per request
    device = torch.device(args.device)
    figures: dict[str, float] = {"images": args.images, "workers": args.workers, "batch_size": args.batch_size}
    server, env = start_store()
    os.environ.update(env)  # this process's readers reach the server as a user's environment would
    try:
        with tempfile.TemporaryDirectory(prefix="bench-stream-") as scratch:
            root = Path(scratch)
            photos = root / "photos"
            write_photos(photos, args.images)
            for size in args.sizes:
                figures.update(measure(args, root, photos, size, env, device))
    finally:
        server.stop()
    print(json.dumps(figures))


def measure(args: argparse.Namespace, root: Path, photos: Path, size: int, env: dict[str, str], device) -> dict:
    local = root / f"litdata-{size}"
    pack(photos, size, f"s3://bench/photos-{size}", env)
    pack(photos, size, str(local), env)
    common = {"batch_size": args.batch_size, "num_workers": args.workers, "pin_memory": False}

    def streamed(source: str, cache: Path) -> StreamedImageDataModule:
        data = StreamedImageDataModule(source=source, cache_dir=str(cache), max_cache_size="10GB", **common)
        data.prepare_data()
        data.setup("fit")
        return data

    def batches_of(data) -> callable:
        def batches():
            for images, _labels, _ids in data.train_dataloader():
                yield images.to(device, non_blocking=True)

        return batches

    memmap = ImageFolderDataModule(
        image_dir=str(photos),
        image_size=size,
        cache_dir=str(root / "packed"),
        val_fraction=0.05,
        storage="memmap",
        **common,
    )
    memmap.prepare_data()
    memmap.setup("fit")
    memmap.seed = 0
    folder = datasets.ImageFolder(
        str(photos),
        transform=transforms.Compose([transforms.Resize(size), transforms.CenterCrop(size), transforms.PILToTensor()]),
    )

    def imagefolder():
        loader = DataLoader(folder, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
        for images, _ in loader:
            yield images.to(device, non_blocking=True)

    sources = ("s3_first_epoch", "s3_cached", "litdata_local", "memmap", "imagefolder")
    rates: dict[str, list[float]] = {name: [] for name in sources}
    local_data = streamed(str(local), root / f"cache-local-{size}")
    for round_index in range(args.rounds):
        cache = root / f"cache-s3-{size}-{round_index}"
        remote = streamed(f"s3://bench/photos-{size}", cache)
        rates["s3_first_epoch"].append(rate(batches_of(remote), device))
        rates["s3_cached"].append(rate(batches_of(remote), device))
        shutil.rmtree(cache, ignore_errors=True)
        rates["litdata_local"].append(rate(batches_of(local_data), device))
        rates["memmap"].append(rate(batches_of(memmap), device))
        rates["imagefolder"].append(rate(imagefolder, device))
    medians = {name: statistics.median(values) for name, values in rates.items()}
    per_item = local_data.per_item
    print(f"{size} px, {per_item} images per item, batches of {args.batch_size}, {args.workers} workers:")
    figures: dict[str, float] = {f"images_per_item_{size}": per_item}
    for name in sources:
        ratio = medians[name] / medians["imagefolder"]
        print(f"  {name:<16} {medians[name]:10.0f} images/s   {ratio:6.2f}x ImageFolder")
        figures[f"{name}_{size}"] = medians[name]
        if name != "imagefolder":
            figures[f"{name}_vs_imagefolder_{size}"] = ratio
    return figures


if __name__ == "__main__":
    main()
