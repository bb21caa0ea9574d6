"""Real multi-process training on CPU (gloo): Lightning's launcher, torchrun, the 2-node script, a killed launcher."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from cifar_classifier.data import CifarDataModule
from cifar_classifier.models import ImageClassifier
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from classifier_engine.cli.trainer_cli import TrainerCLI
from classifier_engine.data.folder import stratified_split
from classifier_engine.testing.cifar_archives import write_archive

from .conftest import (
    DATASET,
    FAST_ARGS,
    NUM_TEST,
    NUM_TRAIN,
    PROJECT_ROOT,
    cli_env,
    default_config,
    free_port,
    images_args,
    make_images,
    only_run_dir,
    run_cli,
)

pytestmark = pytest.mark.slow  # each test starts two or more training processes


def write_indexed_archive(data_dir):
    """A tiny archive whose images carry their own index in their first two pixels."""
    (train_x, train_y), (test_x, test_y) = (
        make_images(n, len(DATASET.class_names), seed) for n, seed in ((NUM_TRAIN, 0), (NUM_TEST, 1))
    )
    for images in (train_x, test_x):
        index = np.arange(len(images))
        images[:, 0, 0, 0], images[:, 0, 0, 1] = index // 256, index % 256
    data_dir.mkdir(parents=True)
    write_archive(data_dir / DATASET.archive_name, DATASET, train_x, train_y, test_x, test_y)


def ddp_args(root, *extra):
    probe = root / "probe.yaml"
    callback = {"class_path": "engine_probes.DataProbe", "init_args": {"output_dir": str(root / "probe")}}
    probe.write_text(yaml.safe_dump({"trainer": {"callbacks+": [callback]}}))
    return [
        "fit", "--config", str(default_config()), "--config", str(PROJECT_ROOT / "configs" / "presets" / "ddp.yaml"),
        "--config", str(probe), *FAST_ARGS, f"--data.data_dir={root / 'data'}", "--data.crop_padding=0",
        "--data.flip=none", "--trainer.max_epochs=2", *extra,
    ]  # fmt: skip


def training_ids(root):
    data = CifarDataModule(data_dir=str(root / "data"), verify_checksum=False, num_workers=0, val_size=32)
    data.setup("validate")  # builds the same split as fit, without fit's batch-size check
    return set(data.train_set.indices.tolist())


def check_shards_and_weights(root, environment, world_size=2):
    records = [json.loads((root / "probe" / f"rank{rank}.json").read_text()) for rank in range(world_size)]
    assert all(r["world_size"] == world_size for r in records)
    assert all(r["environment"] == environment for r in records)  # the launcher that was meant to start them
    expected = training_ids(root)
    for epoch in ("0", "1"):
        shards = [set(r["ids"][epoch]) for r in records]
        assert all(len(shard) == len(r["ids"][epoch]) for shard, r in zip(shards, records, strict=True))
        assert not shards[0] & shards[1], f"ranks overlap in epoch {epoch}"
        assert shards[0] | shards[1] == expected, f"epoch {epoch} does not cover the training set"
    assert records[0]["ids"]["0"] != records[0]["ids"]["1"], "each epoch needs a new permutation"
    assert records[0]["weights"] == records[1]["weights"], "ranks ended with different weights"


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """One 2-process fit launched by Lightning itself (``--trainer.devices 2``)."""
    root = tmp_path_factory.mktemp("ddp")
    write_indexed_archive(root / "data")
    result = run_cli(*ddp_args(root, "--trainer.devices=2"), cwd=root)
    return root, result


@pytest.mark.every_render
def test_two_processes_train_on_disjoint_shards_to_identical_weights(ddp_run):
    root, result = ddp_run
    assert "distributed_backend=gloo" in result.stderr + result.stdout
    assert "sync_dist" not in result.stderr  # the epoch's training means are every rank's already
    check_shards_and_weights(root, "LightningEnvironment")
    run_dir = only_run_dir(root)
    assert sorted(p.name for p in run_dir.glob("**/*.yaml")) == ["config.yaml", "hparams.yaml"]
    best, last = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert best.startswith("best-epoch=") and last == "last.ckpt"
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1
    assert len(list(run_dir.glob("config_hash.txt"))) == 1


@pytest.mark.filterwarnings("ignore:.*does not have many workers.*:UserWarning")
@pytest.mark.filterwarnings("ignore:The dirpath has changed.*:UserWarning")
def test_distributed_validation_equals_single_process(ddp_run, monkeypatch):
    root, _ = ddp_run
    last = only_run_dir(root) / "checkpoints" / "last.ckpt"
    # 33 held-out images: an uneven split over 2 ranks, which must be neither padded nor dropped
    args = ["--config", str(default_config()), *FAST_ARGS, f"--data.data_dir={root / 'data'}", f"--ckpt_path={last}"]
    args.append("--data.val_size=33")
    run_cli(
        "validate",
        *args,
        "--config",
        str(PROJECT_ROOT / "configs" / "presets" / "ddp.yaml"),
        "--trainer.devices=2",
        cwd=root,
    )
    (two_process_dir,) = [p for p in (last.parents[1] / "validate").iterdir() if list(p.glob("events.*"))]
    events = EventAccumulator(str(two_process_dir))
    events.Reload()
    two_process = events.Scalars("val/top1")[-1].value

    monkeypatch.chdir(root)
    monkeypatch.setattr(sys, "argv", ["main.py"])
    single = TrainerCLI(ImageClassifier, args=["validate", *args, "--trainer.devices=1"]).trainer.callback_metrics[
        "val/top1"
    ]
    assert two_process == pytest.approx(float(single), abs=1e-6)


# Every config writes the report; under DDP it is a collective. The full tier (-m slow) only: CI's time.
def test_the_report_of_a_two_process_test_equals_the_single_process_one(ddp_run):
    root, _ = ddp_run
    last = only_run_dir(root) / "checkpoints" / "last.ckpt"
    args = ["--config", str(default_config()), *FAST_ARGS, f"--data.data_dir={root / 'data'}", f"--ckpt_path={last}"]
    ddp = ["--config", str(PROJECT_ROOT / "configs" / "presets" / "ddp.yaml")]
    run_cli("test", *args, *ddp, "--trainer.devices=2", cwd=root)
    run_cli("test", *args, "--trainer.devices=1", cwd=root)
    two, one = sorted(last.parents[1].glob("test/*/report.html"), key=lambda path: path.stat().st_mtime)
    # Each rank judged its share; gathered in the split's order, the files are the single process's.
    for name in ("per_class.csv", "mistakes.csv"):
        assert (two.parent / name).read_text() == (one.parent / name).read_text()


def write_indexed_folder(folder: Path, counts: tuple[int, int, int] = (16, 16, 16)) -> Path:
    """Class folders of 32x32 PNGs (packed as they are) whose first two red pixels carry their packed row."""
    from PIL import Image

    for label, name in enumerate(("ant", "bee", "cow")):
        (folder / name).mkdir(parents=True)
        for index in range(counts[label]):
            row = sum(counts[:label]) + index  # the packed order: by class, then by file name
            pixels = np.full((32, 32, 3), 60 * label, dtype=np.uint8)
            pixels[0, 0, 0], pixels[0, 1, 0] = row // 256, row % 256  # channel 0, as DataProbe reads them
            Image.fromarray(pixels).save(folder / name / f"{index:03d}.png")
    return folder


def test_two_processes_on_a_packed_folder_train_on_disjoint_shards_to_identical_weights(tmp_path):
    photos = write_indexed_folder(tmp_path / "photos")
    probe = tmp_path / "probe.yaml"
    callback = {"class_path": "engine_probes.DataProbe", "init_args": {"output_dir": str(tmp_path / "probe")}}
    probe.write_text(yaml.safe_dump({"trainer": {"callbacks+": [callback]}}))
    ddp = ["--config", str(PROJECT_ROOT / "configs" / "presets" / "ddp.yaml"), "--config", str(probe)]
    args = images_args(photos, *ddp, "--trainer.devices=2", "--data.flip=none", "--data.random_resized_crop=false")
    result = run_cli(*args, "--data.crop_padding=0", "--data.batch_size=4", cwd=tmp_path)
    assert result.stdout.count("Data: packed 48 images") + result.stderr.count("Data: packed 48 images") == 1
    records = [json.loads((tmp_path / "probe" / f"rank{rank}.json").read_text()) for rank in range(2)]
    (packed,) = (tmp_path / "data" / "packed").glob("photos-32px-*")
    train_rows = stratified_split(np.load(packed / "train_labels.npy"), (0.25, 0.0), seed=0)[0]
    for epoch in ("0", "1"):
        shards = [set(record["ids"][epoch]) for record in records]
        # 36 training rows in steps of 2 x 4: each epoch's permutation drops the 4 left over
        assert not shards[0] & shards[1] and len(shards[0] | shards[1]) == 32
        assert shards[0] | shards[1] <= set(train_rows.tolist())
    assert records[0]["weights"] == records[1]["weights"]


def test_the_balanced_sampler_deals_one_draw_per_epoch_over_two_processes(tmp_path):
    photos = write_indexed_folder(tmp_path / "photos", counts=(80, 16, 8))
    probe = tmp_path / "probe.yaml"
    callback = {"class_path": "engine_probes.DataProbe", "init_args": {"output_dir": str(tmp_path / "probe")}}
    probe.write_text(yaml.safe_dump({"trainer": {"callbacks+": [callback]}}))
    ddp = ["--config", str(PROJECT_ROOT / "configs" / "presets" / "ddp.yaml"), "--config", str(probe)]
    args = images_args(photos, *ddp, "--trainer.devices=2", "--data.flip=none", "--data.random_resized_crop=false",
                       "--data.sampler=balanced", "--data.crop_padding=0", "--data.batch_size=4")  # fmt: skip
    run_cli(*args, cwd=tmp_path)
    records = [json.loads((tmp_path / "probe" / f"rank{rank}.json").read_text()) for rank in range(2)]
    (packed,) = (tmp_path / "data" / "packed").glob("photos-32px-*")
    labels = np.load(packed / "train_labels.npy")
    train_rows = set(stratified_split(labels, (0.25, 0.0), seed=0)[0].tolist())
    draws = []
    for epoch in ("0", "1"):
        shares = [record["ids"][epoch] for record in records]
        assert shares[0] != shares[1] and len(shares[0]) == len(shares[1])  # each rank its part of the draw
        drawn = shares[0] + shares[1]
        assert set(drawn) <= train_rows
        per_class = np.bincount(labels[drawn], minlength=3) / len(drawn)
        # 80:16:8 images (60:12:6 train): a plain epoch is 77 % ants and 8 % cows; this one draws each class
        # a third of the time, 72 draws per epoch (bounds about 3 standard deviations wide).
        assert per_class.min() >= 0.15 and per_class.max() <= 0.55, per_class
        draws.append(drawn)
    assert draws[0] != draws[1]  # a new draw each epoch
    assert records[0]["weights"] == records[1]["weights"]


def test_torchrun_launch(tmp_path):
    write_indexed_archive(tmp_path / "data")
    launcher = ("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2")
    run_cli(*ddp_args(tmp_path, "--trainer.devices=2"), cwd=tmp_path, launcher=launcher)
    check_shards_and_weights(tmp_path, "TorchElasticEnvironment")
    only_run_dir(tmp_path)


def test_two_nodes_started_by_the_torchrun_script_meet_at_the_rendezvous(tmp_path):
    write_indexed_archive(tmp_path / "data")
    endpoint = {"NNODES": "2", "NPROC_PER_NODE": "1", "RDZV_ENDPOINT": f"127.0.0.1:{free_port()}"}
    endpoint["CONFIG"] = str(default_config())
    env = cli_env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", **endpoint)  # its torchrun
    script = PROJECT_ROOT / "scripts" / "torchrun.sh"
    # The script gives the fit, the configs, num_nodes and devices; the probe and the tiny settings follow.
    options = ddp_args(tmp_path)[5:]
    nodes = [
        subprocess.Popen(
            ["bash", str(script), *options], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        for _ in range(2)  # the same command on both "nodes": ranks are agreed at the rendezvous
    ]
    outputs = [node.communicate(timeout=300)[0].decode() for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    check_shards_and_weights(tmp_path, "TorchElasticEnvironment")
    config = yaml.safe_load((only_run_dir(tmp_path) / "config.yaml").read_text())
    assert (config["trainer"]["num_nodes"], str(config["trainer"]["devices"])) == (2, "1")


def live_processes_of_group(group: int) -> list[int]:
    """The pids of processes in a process group that are still running (exited ones awaiting a reaper aside)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended while being read
            continue
        state, process_group = fields[0], int(fields[2])
        if process_group == group and state not in ("Z", "X"):
            alive.append(int(stat.parent.name))
    return alive


# The loader workers come from fork servers: each must end with its rank. The full tier (-m slow) only.
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
def test_killing_rank_zero_ends_every_process_of_the_run_within_seconds(tmp_path):
    write_indexed_archive(tmp_path / "data")
    probe = "--trainer.callbacks+=engine_probes.KillAt"
    args = ddp_args(tmp_path, "--trainer.devices=2", "--data.num_workers=2", "--trainer.max_epochs=3", probe)
    launcher = subprocess.Popen(
        [sys.executable, str(PROJECT_ROOT / "main.py"), *args],
        cwd=tmp_path,
        env=cli_env(KILL_AT="train_batch:1:2", KILL_RANK="0"),  # SIGKILL rank 0, the launcher, mid-epoch
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # the run's processes: this process group
    )
    try:
        assert launcher.wait(timeout=300) == -signal.SIGKILL
        deadline = time.monotonic() + 20
        while live_processes_of_group(launcher.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert live_processes_of_group(launcher.pid) == [], "ranks or loader workers outlived the launcher by 20 s"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
def test_a_rank_whose_launcher_dies_stops_instead_of_waiting_for_the_timeout(tmp_path):
    # A rank waiting at the rendezvous for a rank 0 that is gone would wait out the 30-minute
    # timeout (as NCCL ranks in a collective do; gloo ranks notice the closed connection themselves).
    write_indexed_archive(tmp_path / "data")
    rank_one = {"LOCAL_RANK": "1", "NODE_RANK": "0", "WORLD_SIZE": "2"}
    rank_one |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}  # where no rank 0 will ever listen
    start_and_wait = "import subprocess, sys, time; subprocess.Popen(sys.argv[1:]); time.sleep(600)"
    command = [sys.executable, str(PROJECT_ROOT / "main.py"), *ddp_args(tmp_path, "--trainer.devices=2")]
    launcher = subprocess.Popen(
        [sys.executable, "-c", start_and_wait, *command],
        cwd=tmp_path,
        env=cli_env(**rank_one),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        for line in launcher.stderr:  # the rank's own output, through the launcher's
            if "Initializing distributed: GLOBAL_RANK: 1" in line:
                break
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 20
        while live_processes_of_group(launcher.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert live_processes_of_group(launcher.pid) == [], "the rank outlived its launcher by 20 s"
        assert "the launcher of rank 1" in launcher.stderr.read()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)
        launcher.stderr.close()
