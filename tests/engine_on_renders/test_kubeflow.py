"""The Kubeflow TrainJob: valid for the Trainer API; its command trains as two nodes started as the operator would.

Not run here: a Kubernetes cluster. The manifest is checked against the Trainer API's own models
(``kubeflow-trainer-api``); its command runs on localhost with the ``PET_*`` variables the
torch-distributed runtime gives each node.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from kubeflow_trainer_api.models import IoK8sApiCoreV1PersistentVolumeClaim, TrainerV1alpha1TrainJob

from .conftest import PROJECT_ROOT, cli_env, default_config, free_port, only_run_dir
from .test_container import stages
from .test_ddp import check_shards_and_weights, ddp_args, write_indexed_archive

MANIFEST = PROJECT_ROOT / "scripts" / "kubeflow_trainjob.yaml"


def without_nulls(value):
    if isinstance(value, dict):
        return {key: without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [without_nulls(item) for item in value]
    return value


def documents() -> tuple[dict, dict]:
    job, claim = yaml.safe_load_all(MANIFEST.read_text())
    return job, claim


def test_the_manifest_is_a_trainjob_and_a_claim_the_api_models_read_back_whole():
    job, claim = documents()
    # A misspelt or misplaced key is dropped by the models, so reading back whole means every key is known.
    assert without_nulls(TrainerV1alpha1TrainJob.from_dict(job).to_dict()) == job
    assert without_nulls(IoK8sApiCoreV1PersistentVolumeClaim.from_dict(claim).to_dict()) == claim
    assert job["spec"]["runtimeRef"]["name"] == "torch-distributed"

    trainer = job["spec"]["trainer"]
    assert (PROJECT_ROOT / trainer["command"][-1]).is_file()
    env = {item["name"]: item for item in trainer["env"]}
    assert env["CONFIG"]["value"] in {
        str(path.relative_to(PROJECT_ROOT)) for path in (PROJECT_ROOT / "configs").glob("*.yaml")
    }
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):  # the store's keys: from a Secret, never the image
        secret = env[name]["valueFrom"]["secretKeyRef"]
        assert secret["key"] == name and secret["optional"] is True  # a job that streams nothing needs none
    (node,) = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = node["template"]["spec"]["template"]["spec"]
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    mounts = {mount["mountPath"] for mount in pod["containers"][0]["volumeMounts"]}
    (volumes,) = [arguments for instruction, arguments in stages()[-1] if instruction == "VOLUME"]
    assert set(json.loads(volumes)) <= mounts  # the image's data and runs folders are on the volume


@pytest.mark.slow  # two training processes, twice
# the full tier (-m slow) only: CI's time
def test_the_trainjob_command_trains_as_two_nodes_and_a_restarted_job_finds_its_run(tmp_path):
    job, _ = documents()
    trainer = job["spec"]["trainer"]
    write_indexed_archive(tmp_path / "data")
    port = free_port()
    bin_dir = Path(sys.executable).parent  # its torchrun

    def node(rank: int) -> subprocess.Popen:
        env = cli_env(
            PET_NNODES="2",  # two "nodes" of one process here, whatever the manifest asks
            PET_NPROC_PER_NODE="1",
            PET_NODE_RANK=str(rank),
            PET_MASTER_ADDR="127.0.0.1",
            PET_MASTER_PORT=str(port),
            CONFIG=str(default_config()),  # the CIFAR config the archive above is written for
            PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        )
        command = [*trainer["command"][:-1], str(PROJECT_ROOT / trainer["command"][-1]), *trainer["args"]]
        # The probe and the tiny settings follow the manifest's own arguments (the script gives the fit and configs).
        return subprocess.Popen(
            [*command, *ddp_args(tmp_path)[5:]], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )

    def job_run() -> list[str]:
        nodes = [node(rank) for rank in range(2)]
        outputs = [process.communicate(timeout=300)[0].decode() for process in nodes]
        assert [process.returncode for process in nodes] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
        return outputs

    first = job_run()
    check_shards_and_weights(tmp_path, "TorchElasticEnvironment")
    run_dir = only_run_dir(tmp_path)
    assert f"Run: {run_dir.relative_to(tmp_path)}\n" in first[0]  # a fresh start: nothing to resume yet
    step = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]

    restarted = job_run()  # the pods restarted: the same command finds the same run and resumes it
    assert only_run_dir(tmp_path) == run_dir
    assert f"(resumed from {run_dir.relative_to(tmp_path)}/checkpoints/last.ckpt)" in restarted[0]
    assert "Nothing left to train" in restarted[0]  # it had ended; a preempted one continues (test_exact_resume.py)
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == step
