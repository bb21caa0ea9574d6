"""Real multi-process training on CPU (gloo): Lightning's launcher, torchrun, and a 2-node rendezvous."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import numpy as np
import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from {{ cookiecutter.import_name }}.cli import TrainerCLI
from {{ cookiecutter.import_name }}.data import CifarDataModule
from {{ cookiecutter.import_name }}.data.cifar_format import write_archive

from .conftest import (
    DATASET,
    FAST_ARGS,
    NUM_TEST,
    NUM_TRAIN,
    PROJECT_ROOT,
    cli_env,
    default_config,
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
    callback = {"class_path": "tests.probes.DataProbe", "init_args": {"output_dir": str(root / "probe")}}
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


def check_shards_and_weights(root, world_size=2):
    records = [json.loads((root / "probe" / f"rank{rank}.json").read_text()) for rank in range(world_size)]
    assert all(r["world_size"] == world_size for r in records)
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


def test_two_processes_train_on_disjoint_shards_to_identical_weights(ddp_run):
    root, result = ddp_run
    assert "distributed_backend=gloo" in result.stderr + result.stdout
    check_shards_and_weights(root)
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
    args = ["--config", str(default_config()), *FAST_ARGS, f"--data.data_dir={root / 'data'}", f"--ckpt_path={last}"]
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
    single = TrainerCLI(args=["validate", *args, "--trainer.devices=1"]).trainer.callback_metrics["val/top1"]
    assert two_process == pytest.approx(float(single), abs=1e-6)


def test_torchrun_launch(tmp_path):
    write_indexed_archive(tmp_path / "data")
    launcher = ("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2")
    result = run_cli(*ddp_args(tmp_path, "--trainer.devices=2"), cwd=tmp_path, launcher=launcher)
    assert "TorchElasticEnvironment" in result.stderr + result.stdout or (tmp_path / "probe" / "rank1.json").exists()
    check_shards_and_weights(tmp_path)
    only_run_dir(tmp_path)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_two_node_rendezvous_on_localhost(tmp_path):
    write_indexed_archive(tmp_path / "data")
    port = free_port()
    nodes = []
    for node_rank in (0, 1):
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
            f"--node_rank={node_rank}", "--master_addr=127.0.0.1", f"--master_port={port}",
            str(PROJECT_ROOT / "main.py"), *ddp_args(tmp_path, "--trainer.num_nodes=2", "--trainer.devices=1"),
        ]  # fmt: skip
        nodes.append(
            subprocess.Popen(
                command, cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    check_shards_and_weights(tmp_path)
    only_run_dir(tmp_path)
