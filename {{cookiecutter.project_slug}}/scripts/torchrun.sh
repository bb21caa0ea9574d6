#!/bin/bash
# Multi-node DDP with torchrun: the same command on every node.
#   NNODES=2 NPROC_PER_NODE=4 RDZV_ENDPOINT=node0:29500 bash scripts/torchrun.sh [more fit options]
# NNODES: how many nodes (default 1); NPROC_PER_NODE: processes (GPUs) per node (default 1);
# RDZV_ENDPOINT: host:port of one of the nodes, reachable from all (ranks are agreed at this c10d
# rendezvous); RDZV_ID: a job id shared by the nodes (default: the name of this project); CONFIG: the
# config to train (default: configs/{{ cookiecutter.dataset }}.yaml). Runs are written under the current folder.
# Under Kubeflow Trainer (scripts/kubeflow_trainjob.yaml) nothing needs setting: without RDZV_ENDPOINT the
# variables its torch runtime gives every node are used as they are (PET_NNODES, PET_NPROC_PER_NODE,
# PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT; node 0 hosts the rendezvous).
set -euo pipefail
project="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
nnodes="${NNODES:-${PET_NNODES:-1}}"
nproc_per_node="${NPROC_PER_NODE:-${PET_NPROC_PER_NODE:-1}}"
if [[ -n "${RDZV_ENDPOINT:-}" ]]; then
    rendezvous=(--rdzv_backend c10d --rdzv_endpoint "${RDZV_ENDPOINT}" --rdzv_id "${RDZV_ID:-{{ cookiecutter.project_slug }}}")
elif [[ -n "${PET_MASTER_ADDR:-}" ]]; then
    rendezvous=(--node_rank "${PET_NODE_RANK:-0}" --master_addr "${PET_MASTER_ADDR}" --master_port "${PET_MASTER_PORT:-29500}")
else
    echo "error: no rendezvous given; set RDZV_ENDPOINT to host:port of one node, e.g. RDZV_ENDPOINT=node0:29500" >&2
    exit 2
fi
# torchrun also takes auto, gpu or cpu as processes per node; Lightning then counts the devices itself.
devices="${nproc_per_node}"
[[ "${devices}" =~ ^[0-9]+$ ]] || devices=auto

# torchrun itself, with a failed job's report in one line (the failing rank's own line says what to do).
exec python -m classifier_engine.torchrun \
    --nnodes "${nnodes}" \
    --nproc_per_node "${nproc_per_node}" \
    "${rendezvous[@]}" \
    "${project}/main.py" fit \
    --config "${CONFIG:-${project}/configs/{{ cookiecutter.dataset }}.yaml}" \
    --config "${project}/configs/presets/ddp.yaml" \
    --trainer.num_nodes "${nnodes}" \
    --trainer.devices "${devices}" \
    "$@"
