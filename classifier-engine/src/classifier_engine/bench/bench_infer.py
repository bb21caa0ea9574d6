"""What serving costs: PyTorch eager vs onnxruntime fp32 vs onnxruntime int8, on real test images.

Images/s and p50/p99 latency at batch 1 (one request at a time) and batch 256 (offline
scoring), on the CPU (and eager on CUDA with ``--device cuda``). The ONNX files are made by
the project's own export path (int8: static QDQ, calibrated on 512 training images). Every
round runs every runtime once, so machine noise hits all of them alike; the last line is one
JSON object with the figures.

    python -m classifier_engine.bench infer --data_dir data [--ckpt_path CKPT | --config CONFIG [options]]
        [--device cuda]

Without ``--ckpt_path``, the network of ``--config`` (the default config unless told otherwise)
is measured untrained: speed does not depend on the weights.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from .project import project_class

CifarDataModule = project_class("data.CifarDataModule")
from classifier_engine.cli.trainer_cli import TrainerCLI
from classifier_engine.export.evaluation import onnx_predictor
from classifier_engine.export.model_loading import load_model
from classifier_engine.export.onnx_export import export_onnx
from classifier_engine.export.quantize import Calibration, quantize_int8

from .project import (
    DEFAULT_CONFIG,
    ImageClassifier,
)

Runner = Callable[[np.ndarray], object]


def build_model(args: argparse.Namespace, overrides: list[str]) -> tuple[ImageClassifier, str]:
    """The model and its dataset's name: from a checkpoint, or built by the CLI from a config (and ``overrides``)."""
    if args.ckpt_path:
        model, checkpoint = load_model(args.ckpt_path, ImageClassifier)
        return model, checkpoint["datamodule_hyper_parameters"]["dataset"]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cli = TrainerCLI(
            ImageClassifier, default_config=DEFAULT_CONFIG, run=False, args=["--config", str(args.config), *overrides]
        )
    return cli.model.eval(), cli.datamodule.format.name


def eager_runner(model: ImageClassifier, device: torch.device) -> Runner:
    model = copy.deepcopy(model).to(device)

    def run(images: np.ndarray) -> object:
        with torch.inference_mode():
            logits = model(torch.from_numpy(images).to(device))
            if device.type == "cuda":
                torch.cuda.synchronize()
            return logits

    return run


def has_vnni() -> bool:
    """Whether this CPU has the int8 dot-product instructions that make int8 convolutions fast."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(flag in flags.split() for flag in ("avx512_vnni", "avx_vnni", "amx_int8"))


def measure(runners: dict[str, Runner], batches: dict[int, np.ndarray], calls: dict[int, int], rounds: int):
    """Per (runtime, batch): every call's latency in seconds, rounds interleaved across runtimes."""
    latencies = {(name, batch): [] for name in runners for batch in batches}
    for batch, images in batches.items():
        for run in runners.values():  # warm-up: first-call allocation, kernel selection
            run(images)
        for _ in range(rounds):
            for name, run in runners.items():
                for _ in range(calls[batch]):
                    start = time.perf_counter()
                    run(images)
                    latencies[name, batch].append(time.perf_counter() - start)
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data_dir", type=Path, default=Path("data"), help="folder with the dataset archive")
    parser.add_argument("--ckpt_path", type=Path, help="a trained checkpoint (default: the config's network)")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="network to build without a checkpoint")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda to add PyTorch eager on the GPU")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="CPU threads for every runtime")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="few calls (smoke test)")
    args, overrides = parser.parse_known_args()  # the rest are config options, e.g. --model.backbone.width 32
    if overrides and args.ckpt_path:
        parser.error(f"{' '.join(overrides)}: config options apply to --config, not to a checkpoint")
    torch.set_num_threads(args.threads)
    model, dataset = build_model(args, overrides)
    # The images as export.py takes them: through the DataModule (its held-out split, a training sample).
    data = CifarDataModule(dataset, str(args.data_dir), val_size=0, download=False, verify_checksum=False)
    data.prepare_data()
    data.setup("test")
    test = data.held_out_images().images
    batches = {1: np.array(test[:1]), 256: np.array(np.resize(test[:256], (256, 3, 32, 32)))}
    calls = {1: 5, 256: 1} if args.quick else {1: 100, 256: 5}
    rounds = 1 if args.quick else args.rounds

    with tempfile.TemporaryDirectory() as work:
        fp32, int8 = Path(work) / "model.onnx", Path(work) / "model.int8.onnx"
        export_onnx(model, fp32)
        images = data.training_sample(512)
        quantize_int8(fp32, int8, images, Calibration(len(images), "minmax", False, "training"))
        runners = {
            "eager": eager_runner(model, torch.device("cpu")),
            "onnx_fp32": onnx_predictor(fp32, args.threads),
            "onnx_int8": onnx_predictor(int8, args.threads),
        }
        if args.device.startswith("cuda") and torch.cuda.is_available():
            runners["eager_cuda"] = eager_runner(model, torch.device(args.device))
        latencies = measure(runners, batches, calls, rounds)

    result: dict[str, object] = {"device": args.device, "threads": args.threads, "vnni": has_vnni()}
    print(f"{'runtime':<12}{'batch':>6}{'images/s':>12}{'p50 ms':>10}{'p99 ms':>10}{'vs eager':>10}")
    for batch in batches:
        eager_rate = batch * len(latencies["eager", batch]) / sum(latencies["eager", batch])
        for name in runners:
            times = latencies[name, batch]
            rate = batch * len(times) / sum(times)
            p50 = 1000 * statistics.median(times)
            p99 = 1000 * float(np.percentile(times, 99))
            print(f"{name:<12}{batch:>6}{rate:>12,.0f}{p50:>10.3f}{p99:>10.3f}{rate / eager_rate:>10.2f}")
            result[f"{name}_b{batch}_images_per_s"] = rate
            result[f"{name}_b{batch}_p50_ms"] = p50
            result[f"{name}_b{batch}_p99_ms"] = p99
            result[f"{name}_vs_eager_b{batch}"] = rate / eager_rate
    print(f"CPU int8 dot-product instructions (VNNI/AMX): {'yes' if result['vnni'] else 'no'}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
