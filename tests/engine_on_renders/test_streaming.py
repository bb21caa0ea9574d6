"""Images packed by two processes into a real S3-compatible server, streamed to two ranks, stopped and resumed exactly.

A ``moto`` server on localhost stands in for S3 (reached through ``AWS_ENDPOINT_URL``, as a real
endpoint is). The photos carry their own index in their first two pixels, so each rank's per-step
sample ids are read from the pixels it was fed (``engine_probes.DataProbe``).
"""

from __future__ import annotations

import io
import json
import logging
import os
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from .conftest import (
    PHOTO_ROOT,
    PROJECT_ROOT,
    cli_env,
    free_port,
    images_args,
    only_run_dir,
    run_cli,
    write_image_folder,
)
from .test_exact_resume import EXIT_STATUS, assert_same_run, kill_and_resume
from .test_faults import one_error_line, private_mounts

pytest.importorskip("litdata")
pytest.importorskip("moto")
pytestmark = pytest.mark.slow  # CI's tier: those marked every_render (the others run with -m slow)

CLASSES = ("ant", "bee", "wasp")
PER_CLASS = 32  # 96 photos: 72 train, 24 validation
BUCKET = "photos"
STORE = f"s3://{BUCKET}/pets-32"
TINY = [
    "--data.batch_size=8",
    "--data.num_workers=2",
    "--data.flip=none",  # the ids are read from the pixels: no augmentation
    "--data.random_resized_crop=false",
    "--data.crop_padding=0",
    "--data.max_cache_size=1GB",
    "--model.backbone=photo_classifier.models.backbones.FastCNN",
    "--model.backbone.width=4",
    "--trainer.accelerator=cpu",
    "--trainer.max_epochs=3",
    "--trainer.log_every_n_steps=1",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]


def write_indexed_photos(folder: Path) -> None:
    """32 x 32 PNG photos (packed without resampling) whose first two pixels hold their index; a colour per class."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for label, name in enumerate(CLASSES):
        (folder / name).mkdir(parents=True)
        for index in range(PER_CLASS):
            number = label * PER_CLASS + index
            pixels = (rng.integers(0, 60, (32, 32, 3)) + np.eye(3, dtype=np.int64)[label] * 180).astype(np.uint8)
            pixels[0, 0, 0], pixels[0, 1, 0] = number // 256, number % 256  # red of the first two pixels
            path = folder / name / f"{index:03d}.png"
            Image.fromarray(pixels).save(path)
            os.utime(path, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))


def start_server() -> tuple[Any, dict[str, str]]:
    """A local S3 server with a bucket, and the environment that reaches it (as for a real endpoint)."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request would bury a failure's report
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    import boto3

    boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                 aws_access_key_id="testing", aws_secret_access_key="testing").create_bucket(Bucket=BUCKET)  # fmt: skip
    return server, env


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    server, env = start_server()
    root = tmp_path_factory.mktemp("store")
    write_indexed_photos(root / "photos")
    yield root, env
    server.stop()


def pack(root: Path, env: dict[str, str], *extra: str, launcher: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *launcher, str(PHOTO_ROOT / "pack.py"), f"--data.image_dir={root / 'photos'}",
         "--data.image_size=32", "--data.val_fraction=0.25", "--images_per_item=2", *extra],
        cwd=root, capture_output=True, text=True, timeout=300, env=cli_env(**env),
    )  # fmt: skip


@pytest.fixture(scope="module")
def packed(store):
    """The photos packed into the bucket by two processes, each a node (torchrun's RANK and WORLD_SIZE)."""
    root, env = store
    launcher = ("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2")
    result = pack(root, env, f"--output={STORE}", "--workers=1", launcher=launcher)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "(process 0 of 2)" in result.stdout and "(process 1 of 2)" in result.stdout
    return root, env


def stream_args(root: Path, *extra: str) -> list[str]:
    probe = root / "probe.yaml"
    callback = {"class_path": "engine_probes.DataProbe", "init_args": {"output_dir": "probe"}}
    probe.write_text(yaml.safe_dump({"trainer": {"callbacks+": [callback]}}))
    return [
        "fit", "--config", str(PHOTO_ROOT / "configs" / "images.yaml"),
        "--config", str(PHOTO_ROOT / "configs" / "presets" / "streaming.yaml"),
        "--config", str(PROJECT_ROOT / "configs" / "presets" / "ddp.yaml"),
        "--config", str(probe), f"--data.source={STORE}", *TINY, *extra,
    ]  # fmt: skip


def probe_records(root: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted((root / "probe").glob("rank*.json"))]


@pytest.fixture(scope="module")
def reference(packed, tmp_path_factory):
    """An uninterrupted 2-rank x 2-worker run streaming from the bucket."""
    _, env = packed
    root = tmp_path_factory.mktemp("reference")
    args = stream_args(root, "--trainer.devices=2", "--trainer.callbacks+=engine_probes.KillAt")
    run_cli(*args, cwd=root, env=env)
    return root, args


# the full tier (-m slow) only: CI's time
def test_two_packing_processes_fill_the_bucket_with_every_photo_once(packed):
    root, env = packed
    import boto3

    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")  # fmt: skip
    keys = [entry["Key"] for entry in client.list_objects_v2(Bucket=BUCKET)["Contents"]]
    assert "pets-32/dataset.json" in keys and "pets-32/train/index.json" in keys and "pets-32/val/index.json" in keys
    record = json.loads(client.get_object(Bucket=BUCKET, Key="pets-32/dataset.json")["Body"].read())
    assert record["counts"] == {"train": 72, "val": 24} and record["class_names"] == list(CLASSES)
    index = json.loads(client.get_object(Bucket=BUCKET, Key="pets-32/train/index.json")["Body"].read())
    assert sum(chunk["chunk_size"] for chunk in index["chunks"]) == 36  # 72 photos, 2 per item, none twice
    # Packing the same photos there again is a no-op: the record says they are there.
    again = pack(root, env, f"--output={STORE}")
    assert again.returncode == 0, again.stderr[-2000:]


# the full tier (-m slow) only: CI's time
def test_two_ranks_stream_disjoint_shards_covering_the_training_photos(reference):
    root, _ = reference
    records = probe_records(root)
    assert len(records) == 2 and records[0]["weights"] == records[1]["weights"]
    for epoch in ("0", "1", "2"):
        ids = [set(record["ids"][epoch]) for record in records]
        assert not ids[0] & ids[1], "a photo went to both ranks in one epoch"
        assert len(ids[0] | ids[1]) == 64  # 72 photos in 36 items, 4 items per batch: 4 batches per rank
    assert records[0]["ids"]["0"] != records[0]["ids"]["1"]  # a new order each epoch
    summary = (only_run_dir(root) / "logs" / "console.log").read_text()
    assert "streamed, 2 per item" in summary


@pytest.mark.parametrize(
    ("kill", "extra"),
    [
        pytest.param("train_batch:1:2@SIGTERM", (), id="sigterm"),  # CI resumes a folder run and the fine-tune exactly
        pytest.param("train_batch:1:2", ("--safety.last_every_n_train_steps=1",), id="kill-9-after-a-step-checkpoint"),
    ],
)
def test_a_streamed_run_stopped_mid_epoch_resumes_to_exactly_the_uninterrupted_result(
    reference, packed, tmp_path, kill, extra
):
    reference_root, args = reference
    _, env = packed
    if extra:  # the same config as the reference, with step checkpoints: its own reference run
        args = [*args, *extra]
        uninterrupted = tmp_path / "uninterrupted"
        uninterrupted.mkdir()
        run_cli(*args, cwd=uninterrupted, env=env)
        reference_root = uninterrupted
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    kill_and_resume(args, resumed, [kill], env)
    expected, actual = probe_records(reference_root), probe_records(resumed)
    for before, after in zip(expected, actual, strict=True):
        # The resumed process saw epoch 1 from the batch after the last one trained, then all of epoch 2.
        assert after["ids"]["2"] == before["ids"]["2"]
        assert before["ids"]["1"][-len(after["ids"]["1"]) :] == after["ids"]["1"]
        assert after["weights"] == before["weights"]
    assert_same_run(reference_root, resumed, compare_scalars=False)


def test_stopped_on_two_ranks_resumed_on_one_each_image_of_the_epoch_is_trained_once(reference, packed, tmp_path):
    reference_root, _ = reference
    _, env = packed
    args = stream_args(tmp_path, "--data.global_batch_size=16", "--trainer.callbacks+=engine_probes.KillAt")
    stopped = subprocess.run(
        [sys.executable, str(PHOTO_ROOT / "main.py"), *args, "--trainer.devices=2"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env=cli_env(KILL_AT="train_batch:1:2", KILL_SIGNAL="SIGTERM", **env),
    )  # fmt: skip
    assert stopped.returncode == EXIT_STATUS["SIGTERM"], stopped.stderr[-3000:]
    checkpoint = only_run_dir(tmp_path) / "checkpoints" / "last.ckpt"
    saved = checkpoint.read_bytes()
    one_rank = [*args, "--trainer.devices=1", "--ckpt_path=last", "--allow_config_change=true"]
    # Another number of images per step would make the trainer's batch count mean other images: refused.
    refused = run_cli(*one_rank, "--data.global_batch_size=null", cwd=tmp_path, env=env, check=False)
    assert "set data.global_batch_size 16" in one_error_line(refused, code=2) and checkpoint.read_bytes() == saved
    resumed = run_cli(*one_rank, cwd=tmp_path, env=env)
    assert "restriped, none repeated" in resumed.stdout + resumed.stderr
    (after,) = probe_records(tmp_path)
    steps = torch.load(io.BytesIO(saved), weights_only=True)["loops"]["fit_loop"]["epoch_loop.batch_progress"]
    done = steps["current"]["ready"]
    assert 0 < done < 4  # stopped mid-epoch (4 steps of 16)
    # Until the stop both ranks trained what the reference's did (the same layout, resumed exactly elsewhere).
    before = [record["ids"]["1"][: done * 8] for record in probe_records(reference_root)]
    trained = [*before[0], *before[1], *after["ids"]["1"]]
    assert len(trained) == len(set(trained)) == 64  # none repeated, and as many as an uninterrupted epoch
    assert set(trained) == {i for record in probe_records(reference_root) for i in record["ids"]["1"]}
    assert len(after["ids"]["2"]) == len(set(after["ids"]["2"])) == 64  # the next epoch, laid out for one rank


@pytest.mark.every_render
def test_reading_the_store_leaves_the_run_s_random_state_as_it_found_it(packed, tmp_path, monkeypatch):
    """Store clients draw from Python's global random (s3transfer's temporary names) whenever a cache misses."""
    import random

    from classifier_engine.data import StreamedImageDataModule

    for name, value in packed[1].items():
        monkeypatch.setenv(name, value)
    random.seed(0)
    before = random.getstate()
    data = StreamedImageDataModule(source=STORE, cache_dir=str(tmp_path / "cache"), batch_size=8, num_workers=0)
    data.prepare_data()  # every file read afresh: nothing cached
    data.setup("fit")
    assert (tmp_path / "cache").is_dir() and len(data.val_set) == 24
    assert random.getstate() == before
    assert data.training_sample(4).shape[0] == 4 and random.getstate() == before


# the full tier (-m slow) only: CI's time
def test_export_judges_the_streamed_run_on_its_held_out_split(reference, packed):
    root, _ = reference
    _, env = packed
    checkpoint = only_run_dir(root) / "checkpoints" / "last.ckpt"
    result = subprocess.run(
        [sys.executable, str(PHOTO_ROOT / "export.py"), f"--ckpt_path={checkpoint}", "--formats=onnx",
         "--config", str(checkpoint.parents[1] / "config.yaml")],  # the store is the config's, never the checkpoint's
        cwd=root, capture_output=True, text=True, timeout=300, env=cli_env(**env),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    card = json.loads((checkpoint.parent / "export" / "model.card.json").read_text())
    assert card["evaluation"]["images"] == 24 and card["evaluation"]["split"] == "val"
    held_out = torch.load(checkpoint, weights_only=True)["PhotoDataModule"]  # the project's class, streaming
    assert held_out["source"] == STORE


@pytest.mark.every_render
@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}, "does not answer"),
        ({}, "does not exist"),
        ({}, "holds no packed dataset"),
        ({}, "was packed with image_size 32"),
        ({"AWS_SECRET_ACCESS_KEY": "wrong"}, "refused the credentials"),
        (
            {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_EC2_METADATA_DISABLED": "true"},
            "no credentials for the store were found",
        ),
    ],
    ids=["not-answering", "missing-bucket", "missing-prefix", "other-image-size", "wrong-keys", "no-keys"],
)
def test_a_store_that_cannot_be_used_is_one_line_and_nothing_is_written(packed, tmp_path, change, expected):
    _, env = packed
    source = {"does not exist": "s3://no-such-bucket/x", "holds no packed dataset": f"s3://{BUCKET}/nothing"}
    args = [f"--data.source={source.get(expected, STORE)}", "--data.num_workers=0"]
    if expected.startswith("was packed"):
        args.append("--data.image_size=64")
    checking_keys = expected == "refused the credentials"
    if checking_keys:  # the server checks every request's keys from now on (it knows none: all are refused)
        set_key_checks(env, "0")
    try:
        result = run_cli(*stream_args(tmp_path, *args), cwd=tmp_path, check=False, env={**env, **change})
    finally:
        if checking_keys:
            set_key_checks(env, "inf")
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error: ") and expected in lines[-1], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["probe.yaml"]  # no run, no cache


def set_key_checks(env: dict[str, str], after: str) -> None:
    """Make the moto server check the keys of requests after the next ``after`` ones ("inf": never)."""
    request = urllib.request.Request(
        f"{env['AWS_ENDPOINT_URL']}/moto-api/reset-auth", data=after.encode(), headers={"Content-Type": "text/plain"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


@pytest.mark.every_render
def test_a_cache_disk_without_room_for_the_held_out_images_is_one_line_and_nothing_is_written(packed, tmp_path):
    mounts = private_mounts()
    if mounts is None:
        pytest.skip("no private mount namespace here (unshare) to give the cache a small disk of its own")
    _, env = packed
    (tmp_path / "cache").mkdir()
    args = stream_args(tmp_path, "--data.num_workers=0", "--data.cache_dir=cache")
    command = shlex.join([sys.executable, str(PHOTO_ROOT / "main.py"), *args])
    result = subprocess.run(
        [*mounts, "sh", "-c", f"mount -t tmpfs -o size=256k tmpfs cache && {command}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=cli_env(**env),
    )  # fmt: skip
    line = one_error_line(result)
    assert line.startswith("error: no space left on the disk of cache/") and " to write val (needs about " in line
    (run,) = tmp_path.glob("runs/*/*")
    assert line.endswith("point data.cache_dir at a disk with room; no checkpoint of this run was saved; then run "
                         "the same command to start it over (FULL_ERROR=1 prints the traceback here; full report: "
                         f"{run.relative_to(tmp_path)}/logs/error.log)"), line  # fmt: skip
    assert sorted(path.name for path in run.iterdir()) == ["logs"]  # the report of what happened, nothing else
    assert not any((tmp_path / "cache").iterdir())  # the mount is gone, and nothing was written under it


def test_a_store_that_stops_answering_mid_run_ends_every_rank_in_one_line(tmp_path):
    """A cache too small to keep the chunks reads them again each epoch; the store goes after the first epoch."""
    server, env = start_server()
    try:
        write_indexed_photos(tmp_path / "photos")
        assert pack(tmp_path, env, f"--output={STORE}").returncode == 0
        args = stream_args(tmp_path, "--trainer.devices=2", "--data.max_cache_size=10KB", "--trainer.max_epochs=20")
        training = subprocess.Popen(
            [sys.executable, str(PHOTO_ROOT / "main.py"), *args],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(**env),
        )  # fmt: skip
        deadline = time.monotonic() + 240
        while training.poll() is None and time.monotonic() < deadline:
            if any(tmp_path.glob("runs/*/*/checkpoints/*.ckpt")):  # the first epoch is trained and validated
                break
            time.sleep(0.1)
    finally:
        server.stop()
    training.wait(timeout=240)
    # No process of the run outlives it: a loader worker waiting for a chunk held the output open for minutes.
    stdout, stderr = training.communicate(timeout=30)
    line = one_error_line(subprocess.CompletedProcess(training.args, training.returncode, stdout, stderr))
    assert f"failed: reading {STORE} failed in a data loader worker (" in line, line
    assert "check the network and the store" in line and line.count("--ckpt_path last") == 1, line
    (stopped,) = [text for text in stderr.splitlines() if " stopped: " in text]  # the other rank, once
    assert stopped.endswith("failed (a data loader worker failed); its error line says what to do"), stopped
    (last,) = tmp_path.glob("runs/*/*/checkpoints/last.ckpt")
    assert f"{last.relative_to(tmp_path)} holds step {torch.load(last, weights_only=True)['global_step']}" in line


@pytest.mark.every_render
def test_packing_into_a_missing_bucket_is_one_line(store):
    root, env = store
    result = pack(root, env, "--output=s3://no-such-bucket/x")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: ") and "does not exist" in result.stderr


@pytest.mark.every_render
def test_a_pack_counts_what_it_stored_and_a_bad_image_under_error_leaves_nothing(tmp_path):
    photos = write_image_folder(tmp_path / "photos", ("cat", "dog"), per_class=14)
    for name in ("cat/broken.jpg", "dog/empty.png"):
        (photos / name).write_bytes(b"not an image" if name.endswith("jpg") else b"")
    command = [sys.executable, str(PHOTO_ROOT / "pack.py"), f"--data.image_dir={photos}", "--data.image_size=32",
               "--data.val_fraction=0.25", "--workers=1"]  # fmt: skip
    packed = subprocess.run([*command, "--output=store"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env=cli_env())  # fmt: skip
    assert packed.returncode == 0, packed.stderr[-3000:]
    from litdata import StreamingDataset

    record = json.loads((tmp_path / "store" / "dataset.json").read_text())
    stored = {split: sum(len(item["labels"]) for item in StreamingDataset(str(tmp_path / "store" / split)))
              for split in record["counts"]}  # fmt: skip
    assert record["counts"] == stored and sum(stored.values()) == 28  # 30 listed, 2 unreadable
    assert f"Packed 28 images (train {stored['train']}, val {stored['val']})" in packed.stdout
    assert "2 unreadable files left out" in packed.stdout and record["source"] == "photos"
    skipped = {line for path in (tmp_path / "store").glob("skipped-*-0.txt") for line in path.read_text().split()}
    assert skipped == {"cat/broken.jpg", "dog/empty.png"}

    # About 21 training images, 32 per item (the default at 32 px): no batch of whole items; the line says what works.
    fit = ["fit", "--config", str(PHOTO_ROOT / "configs" / "images.yaml"),
           "--config", str(PHOTO_ROOT / "configs" / "presets" / "streaming.yaml"), "--data.source=store",
           "--data.image_size=32", *(arg for arg in TINY if not arg.startswith("--data.batch_size"))]  # fmt: skip
    refused = run_cli(*fit, cwd=tmp_path, check=False)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    last_line = refused.stderr.strip().splitlines()[-1]
    assert last_line.startswith("error: store holds ") and "fewer than one item of 32" in last_line
    assert last_line.endswith("pack it again with pack.py --images_per_item 8 (or fewer) into another --output")

    strict = subprocess.run([*command, "--output=strict", "--data.on_bad_image=error"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300, env=cli_env())  # fmt: skip
    assert strict.returncode == 1 and "Traceback" not in strict.stderr + strict.stdout
    (line,) = strict.stderr.strip().splitlines()
    assert line.startswith("error: ") and "is not a readable image" in line and "on_bad_image skip" in line
    assert not (tmp_path / "strict").exists()


@pytest.mark.every_render
def test_pack_holds_out_what_the_project_s_own_split_holds_out(tmp_path):
    photos = write_image_folder(tmp_path / "photos", per_class=12)
    command = [sys.executable, str(PHOTO_ROOT / "pack.py"), "--data=own_split.LastTwoHeldOut",
               f"--data.image_dir={photos}", "--data.image_size=32", "--data.val_fraction=0.5",
               f"--output={tmp_path / 'packed'}"]  # fmt: skip
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=cli_env())
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((tmp_path / "packed" / "dataset.json").read_text())
    assert record["counts"] == {"train": 30, "val": 6}  # two of each of the three classes, not half of them


# the full tier (-m slow) only: CI's time
def test_the_project_s_own_split_and_augmentation_apply_to_packed_and_streamed_runs_alike(tmp_path):
    # One DataModule class of the user's for every storage: memory-mapped (packed at the first fit), and streamed
    # from a store pack.py wrote through the same class (data.source set, no class swap).
    photos = write_image_folder(tmp_path / "photos", per_class=12)
    own = "--data=own_split.OwnAugmentation"
    mapped, streamed = tmp_path / "mapped", tmp_path / "streamed"
    for root in (mapped, streamed):
        root.mkdir()
    fit = images_args(photos, "--trainer.max_epochs=1")
    fit.insert(fit.index(f"--data.image_dir={photos}"), own)  # before the data options, as a config would set it
    result = run_cli(*fit, cwd=mapped)
    assert "30 training and 6 validation images" in result.stdout  # its split: the last two photos of each class
    assert (mapped / "augmented-by-the-project").is_file()
    packing = [sys.executable, str(PHOTO_ROOT / "pack.py"), own, f"--data.image_dir={photos}", "--data.image_size=32",
               "--images_per_item=2", f"--output={streamed / 'store'}"]  # fmt: skip
    packed = subprocess.run(packing, cwd=streamed, capture_output=True, text=True, timeout=300, env=cli_env())
    assert packed.returncode == 0, packed.stderr[-3000:]
    stream = [arg for arg in fit if arg != f"--data.image_dir={photos}"]
    stream[stream.index(own) : stream.index(own)] = [
        "--config",
        str(PHOTO_ROOT / "configs" / "presets" / "streaming.yaml"),
    ]
    result = run_cli(*stream, "--data.source=store", cwd=streamed)
    assert "30 training images (streamed" in result.stdout and "6 validation images" in result.stdout
    assert (streamed / "augmented-by-the-project").is_file()
    (config,) = streamed.glob("runs/images/*/config.yaml")
    data = yaml.safe_load(config.read_text())["data"]
    assert data["class_path"] == "own_split.OwnAugmentation" and data["init_args"]["source"] == "store"
    refused = subprocess.run([*packing[:-1], f"--output={tmp_path / 'again'}", "--data.source=store"], cwd=streamed,
                             capture_output=True, text=True, timeout=300, env=cli_env())  # fmt: skip
    assert refused.returncode != 0 and refused.stderr.strip().splitlines()[-1].startswith("error: data.source is store")


@pytest.mark.every_render
def test_the_documented_pack_then_stream_commands_work_as_written(tmp_path):
    # docs/cluster.md and pack.py, on a folder: pack at 64 px through configs/images.yaml, then fine-tune the
    # default network (from a weights file: no download here) on the stream.
    from .test_finetune import default_weights

    photos = write_image_folder(tmp_path / "photos", per_class=12)
    weights = default_weights(tmp_path / "default.pth")
    offline = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    packing = [sys.executable, str(PHOTO_ROOT / "pack.py"), "--data.image_dir", str(photos), "--data.image_size", "64",
               "--output", str(tmp_path / "photos-64")]  # fmt: skip
    packed = subprocess.run(packing, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=cli_env(**offline))
    assert packed.returncode == 0, packed.stderr[-3000:]
    assert "at 64 px" in packed.stdout
    result = run_cli(
        "fit", "--config", str(PHOTO_ROOT / "configs" / "images.yaml"),
        "--config", str(PHOTO_ROOT / "configs" / "presets" / "streaming.yaml"),
        "--data.source", str(tmp_path / "photos-64"), f"--model.backbone.weights_path={weights}",
        "--trainer.max_epochs=1", "--trainer.accelerator=cpu", "--data.num_workers=0",
        "--trainer.enable_progress_bar=false",
        cwd=tmp_path, env=offline,
    )  # fmt: skip
    assert "Data: " in result.stdout and "64 px" in result.stdout
    (checkpoint,) = tmp_path.glob("runs/images/*/checkpoints/last.ckpt")
    assert torch.load(checkpoint, weights_only=True)["preprocessing"]["interpolation"] == "bicubic"  # the weights'
