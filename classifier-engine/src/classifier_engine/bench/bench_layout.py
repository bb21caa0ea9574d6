"""Does ``model.channels_last`` pay here? The config's network in NCHW against NHWC memory order.

A training step (forward, backward, AdamW) and an evaluation forward of the same network, on the same
random images at the config's size, in both orders; rounds interleaved (A, B, A, B) so machine noise hits
both. Speed does not depend on the weights, so the network is built untrained. The last line is one JSON
object with the figures and the ratios (NHWC's images/s over NCHW's).

    python -m classifier_engine.bench layout [--config configs/images.yaml] [--device cpu|cuda] [--quick]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import timm
import torch
import yaml

from .project import DEFAULT_CONFIG


def timm_network(config: Path) -> tuple[str, int]:
    """The timm name and image size a config trains (its ``model.backbone.init_args.name``, ``data...image_size``)."""
    settings = yaml.safe_load(config.read_text())
    try:
        name = settings["model"]["backbone"]["init_args"]["name"]
        size = settings["data"]["init_args"].get("image_size", 224)
    except (KeyError, TypeError):
        raise SystemExit(
            f"error: {config} names no timm network (model.backbone.init_args.name); "
            "give --config a config that trains one, e.g. configs/images.yaml"
        ) from None
    return name.split(".")[0], int(size)


def images_per_second(step: Callable[[], object], images: int, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        step()
    return images * calls / (time.perf_counter() - start)


def steps(network: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor) -> dict[str, Callable[[], object]]:
    """A training step and an evaluation forward of ``network`` on ``images`` (already in its memory order)."""
    optimizer = torch.optim.AdamW(network.parameters(), lr=1e-4)

    def train() -> None:
        network.train()
        loss = torch.nn.functional.cross_entropy(network(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    def evaluate() -> None:
        network.eval()
        with torch.inference_mode():
            network(images)

    return {"train": train, "evaluate": evaluate}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="a config training a timm network")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch_size", type=int, default=16, help="the photo default's batch below 1,000 images")
    parser.add_argument("--calls", type=int, default=4, help="steps per round and side")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a 64-px image, one call a round (smoke test)")
    args = parser.parse_args()
    name, size = timm_network(args.config)
    if args.quick:
        size, args.calls, args.rounds, args.batch_size = 64, 1, 1, 4
    device = torch.device(args.device)
    torch.manual_seed(0)
    built = timm.create_model(name, pretrained=False, num_classes=10)
    images = torch.randn(args.batch_size, 3, size, size, device=device)
    labels = torch.randint(0, 10, (args.batch_size,), device=device)
    sides = {}
    for layout, memory_format in (("nchw", torch.contiguous_format), ("nhwc", torch.channels_last)):
        network = copy.deepcopy(built).to(device, memory_format=memory_format)
        sides[layout] = steps(network, images.contiguous(memory_format=memory_format), labels)
    figures: dict[str, list[float]] = {f"{layout}_{kind}": [] for layout in sides for kind in ("train", "evaluate")}
    for layout_steps in sides.values():  # warm-up: first-call allocation, kernel choice
        for step in layout_steps.values():
            step()
    for _ in range(args.rounds):
        for layout, layout_steps in sides.items():
            for kind, step in layout_steps.items():
                figures[f"{layout}_{kind}"].append(images_per_second(step, args.batch_size, args.calls))
    result: dict[str, object] = {
        "network": name,
        "image_size": size,
        "batch_size": args.batch_size,
        "device": args.device,
        "threads": torch.get_num_threads(),
    }
    for kind in ("train", "evaluate"):
        nchw, nhwc = (statistics.median(figures[f"{layout}_{kind}"]) for layout in ("nchw", "nhwc"))
        result |= {
            f"{kind}_nchw_images_per_s": round(nchw, 2),
            f"{kind}_nhwc_images_per_s": round(nhwc, 2),
            f"{kind}_ratio": round(nhwc / nchw, 2),
        }
        print(f"{kind:>8}: NCHW {nchw:7.1f} images/s   NHWC {nhwc:7.1f} images/s   ratio {nhwc / nchw:.2f}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
