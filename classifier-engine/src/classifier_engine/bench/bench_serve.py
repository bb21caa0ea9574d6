"""What serving over HTTP costs: ``serve.py``'s throughput and latency by batch size, against onnxruntime in-process.

For each of ``--batch_sizes`` B, in the same run:

- **the ceiling**: the same photos decoded and answered in this process, B at a time, by the code the server
  runs (``ExportedModel``: the card's decode, onnxruntime, the answers), with the server's threads;
- **saturation**: a server started on localhost with ``--max_batch_size B`` and 2·B clients, each sending one
  photo after another for ``--seconds``: its throughput and p50/p95/p99 latency.

Then, at the batch size that served most, requests arriving at random (Poisson) at 80 % of its saturation rate,
the latency a service sees under load, and at twice its saturation rate: an overload the server must meet with
503s only, no timeout and no crash. The last line is one JSON object with the figures and the ratios.

    python -m classifier_engine.bench serve --model runs/<dataset>/<hash>/checkpoints/export
        [--photos DIR] [--seconds 10] [--batch_sizes 1 4 8 16] [--threads N] [--format onnx|int8]

The clients run on the same machine as the server and take some of its CPU, as a sidecar or a load balancer on
the host would; the in-process ceiling has no such cost, so the ratio is a lower bound.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from classifier_engine.serving.exported_model import FILES, ExportedModel

PHOTO_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp")
TIMEOUT = 30.0  # seconds a client waits for an answer: past it, a timeout (status 0)
REFUSED = -1  # the connection was refused or reset: the server is down


@dataclass
class Phase:
    """One phase's requests: each one's status and seconds, and the phase's length."""

    name: str
    seconds: float
    results: list[tuple[int, float]] = field(default_factory=list)

    @property
    def statuses(self) -> Counter[int]:
        return Counter(status for status, _ in self.results)

    def figures(self) -> dict:
        answered = sorted(seconds for status, seconds in self.results if status == 200)
        milliseconds = (lambda q: round(1000 * float(np.percentile(answered, q)), 1)) if answered else (lambda q: None)
        return {
            "phase": self.name,
            "images_per_s": round(len(answered) / self.seconds, 2),
            "p50_ms": milliseconds(50),
            "p95_ms": milliseconds(95),
            "p99_ms": milliseconds(99),
            "statuses": {str(status): count for status, count in sorted(self.statuses.items())},
        }


def photo_files(folder: Path | None, count: int = 64) -> list[tuple[bytes, str]]:
    """The photos sent, as (bytes, content type): a folder's own, or ``count`` JPEGs of a phone photo's size."""
    if folder is not None:
        paths = sorted(path for path in folder.rglob("*") if path.suffix.lower() in PHOTO_SUFFIXES)
        if not paths:
            raise SystemExit(f"error: {folder} holds no photos ({', '.join(PHOTO_SUFFIXES)}); give a folder of them")
        kinds = {".png": "image/png", ".webp": "image/webp", ".bmp": "image/bmp"}
        return [(path.read_bytes(), kinds.get(path.suffix.lower(), "image/jpeg")) for path in paths[:256]]
    from PIL import Image

    rng, made = np.random.default_rng(0), []
    for _ in range(count):
        gradient = np.linspace(0, 255, 640, dtype=np.float32)[None, :, None] * rng.random(3, dtype=np.float32)
        pixels = np.clip(gradient + rng.normal(0, 25, (480, 640, 3)), 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
        made.append((buffer.getvalue(), "image/jpeg"))
    return made


def in_process(model: ExportedModel, photos: list[tuple[bytes, str]], batch: int, seconds: float) -> Phase:
    """The ceiling: the server's own work (decode, graph, answers) for ``seconds``, ``batch`` photos at a time."""
    phase, index = Phase(f"in-process, batch {batch}", seconds), 0
    model.answer(np.stack([model.pixels(photos[0][0])] * batch))  # warm up
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        begun = time.perf_counter()
        chosen = [photos[(index + offset) % len(photos)][0] for offset in range(batch)]
        model.answer(np.stack([model.pixels(data) for data in chosen]))
        took = time.perf_counter() - begun
        phase.results += [(200, took)] * batch
        index += batch
    phase.seconds = time.perf_counter() - started
    return phase


async def post(port: int, body: bytes, content_type: str) -> tuple[int, float]:
    """One ``POST /predict`` on its own connection: (status, seconds); 0 for a timeout, -1 for a refused one."""
    started = time.perf_counter()
    head = (
        f"POST /predict HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), TIMEOUT)
        try:
            writer.write(head + body)
            await writer.drain()
            reply = await asyncio.wait_for(reader.read(), TIMEOUT - (time.perf_counter() - started))
        finally:
            writer.close()
        status = int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/") else REFUSED
    except TimeoutError:
        status = 0
    except OSError:
        status = REFUSED
    return status, time.perf_counter() - started


async def closed_loop(port: int, photos: list[tuple[bytes, str]], clients: int, seconds: float, name: str) -> Phase:
    """``clients`` clients, each sending its next photo as soon as the last is answered, for ``seconds``."""
    phase = Phase(name, seconds)
    started = time.perf_counter()

    async def client(first: int) -> None:
        index = first
        while time.perf_counter() - started < seconds:
            phase.results.append(await post(port, *photos[index % len(photos)]))
            index += clients

    await asyncio.gather(*(client(number) for number in range(clients)))
    phase.seconds = time.perf_counter() - started
    return phase


async def open_loop(port: int, photos: list[tuple[bytes, str]], rate: float, seconds: float, name: str) -> Phase:
    """Requests arriving at random (Poisson, ``rate`` a second) for ``seconds``, whatever the answers take."""
    phase, rng, sent = Phase(name, seconds), np.random.default_rng(0), []
    started = arrival = time.perf_counter()
    while True:
        arrival += rng.exponential(1 / rate)
        if arrival - started > seconds:
            break
        await asyncio.sleep(max(0.0, arrival - time.perf_counter()))
        sent.append(asyncio.create_task(post(port, *photos[len(sent) % len(photos)])))
    phase.results = list(await asyncio.gather(*sent))
    phase.seconds = time.perf_counter() - started
    return phase


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
            return response.read() == b"ok"
    except OSError:
        return False


class Server:
    """``serve.py`` on a free localhost port, as a user starts it, stopped (with its workers) on leaving."""

    def __init__(self, args: argparse.Namespace, batch: int, log: Path) -> None:
        self.port, self.log = free_port(), log
        self.command = [
            sys.executable,
            "-m",
            "classifier_engine.serving.server",
            "--model",
            str(args.model),
            "--format",
            args.format,
            "--port",
            str(self.port),
            "--max_batch_size",
            str(batch),
            "--batch_timeout",
            str(args.batch_timeout),
            "--max_waiting",
            str(args.max_waiting),
            *(["--threads", str(args.threads)] if args.threads else []),
        ]

    def __enter__(self) -> Server:
        self.output = self.log.open("w")
        self.process = subprocess.Popen(
            self.command, stdout=self.output, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + 180
        while not healthy(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise SystemExit(f"error: serve.py did not start; its words: {self.log.read_text()[-2000:]}")
            time.sleep(0.5)
        return self

    def __exit__(self, *_: object) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.output.close()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m classifier_engine.bench serve", description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--model", type=Path, required=True, help="the folder export.py wrote")
    add("--format", choices=tuple(FILES), default="onnx", help="which of its graphs")
    add("--photos", type=Path, help="a folder of photos to send (default: 64 generated 640x480 JPEGs)")
    add("--seconds", type=float, default=10.0, help="how long each phase runs")
    add("--batch_sizes", type=int, nargs="+", default=[1, 4, 8, 16], help="the servers' --max_batch_size values")
    add("--batch_timeout", type=float, default=0.01, help="the servers' --batch_timeout")
    add("--max_waiting", type=int, default=64, help="the servers' --max_waiting (past it: 503)")
    add("--threads", type=int, help="onnxruntime's threads, in the server and in-process (default: its choice)")
    args = parser.parse_args()
    if args.max_waiting < 2 * max(args.batch_sizes):
        parser.error(
            f"--max_waiting must be at least {2 * max(args.batch_sizes)}: saturation runs 2 clients a batch slot"
        )
    return args


def show(phase: Phase) -> None:
    figures = phase.figures()
    print(
        f"  {phase.name:<34} {figures['images_per_s']:>8.2f} images/s   p50 {figures['p50_ms']} ms"
        f"   p95 {figures['p95_ms']} ms   p99 {figures['p99_ms']} ms   statuses {figures['statuses']}",
        flush=True,
    )


def main() -> None:
    args = parse_args()
    photos = photo_files(args.photos)
    model = ExportedModel(args.model, args.format, args.threads)  # a folder that is not an export: one line
    print(f"{len(photos)} photos; {args.seconds:g} s a phase; {os.cpu_count()} CPU cores", flush=True)
    ceiling, served = {}, {}
    with tempfile.TemporaryDirectory() as scratch:
        for batch in args.batch_sizes:
            print(f"batch {batch}:", flush=True)
            ceiling[batch] = in_process(model, photos, batch, args.seconds)
            show(ceiling[batch])
            with Server(args, batch, Path(scratch) / f"serve-{batch}.log") as server:
                warm = closed_loop(server.port, photos, 2 * batch, min(2.0, args.seconds), "warm-up")
                asyncio.run(warm)
                served[batch] = asyncio.run(
                    closed_loop(server.port, photos, 2 * batch, args.seconds, f"served, {2 * batch} clients")
                )
            show(served[batch])
        best = max(served, key=lambda batch: served[batch].figures()["images_per_s"])
        saturation = served[best].figures()["images_per_s"]
        print(f"batch {best} (served most), requests arriving at random:", flush=True)
        with Server(args, best, Path(scratch) / "serve-load.log") as server:
            loaded = asyncio.run(
                open_loop(server.port, photos, 0.8 * saturation, args.seconds, "at 80 % of saturation")
            )
            show(loaded)
            overload = asyncio.run(open_loop(server.port, photos, 2 * saturation, args.seconds, "at 2x saturation"))
            show(overload)
            still_healthy = healthy(server.port)
    load, over = loaded.figures(), overload.figures()
    ratio = saturation / max(ceiling[best].figures()["images_per_s"], 1e-9)
    tail = (load["p99_ms"] or 0) / max(load["p50_ms"] or 1e-9, 1e-9)
    below = sum(count for status, count in loaded.statuses.items() if status != 200)
    unexpected = sum(count for status, count in overload.statuses.items() if status not in (200, 503))
    print(
        f"served / in-process at batch {best}: {ratio:.2f}x;  p99 / p50 at 80 % of saturation: {tail:.2f}x;  "
        f"failed below saturation: {below};  at 2x: {over['statuses'].get('503', 0)} shed (503), "
        f"{unexpected} other failures, healthy after: {still_healthy}",
        flush=True,
    )
    print(
        json.dumps(
            {
                "photos": len(photos),
                "seconds": args.seconds,
                "format": args.format,
                "threads": args.threads,
                "in_process": {str(batch): phase.figures() for batch, phase in ceiling.items()},
                "served": {str(batch): phase.figures() for batch, phase in served.items()},
                "best_batch": best,
                "served_over_in_process": round(ratio, 3),
                "at_80_percent": load,
                "p99_over_p50_at_80_percent": round(tail, 2),
                "failed_below_saturation": below,
                "at_2x": over,
                "failures_at_2x_other_than_503": unexpected,
                "healthy_after_overload": still_healthy,
            }
        )
    )


if __name__ == "__main__":
    main()
