#!/bin/bash
# Multi-node DDP with torchrun: the same command on every node (ranks are agreed at the rendezvous).
#   NNODES=2 NPROC_PER_NODE=4 RDZV_ENDPOINT=node0:29500 bash scripts/torchrun.sh [more fit options]
# NNODES: how many nodes (default 1); NPROC_PER_NODE: processes (GPUs) per node (default 1);
# RDZV_ENDPOINT: host:port of one of the nodes, reachable from all; RDZV_ID: a job id shared by
# the nodes (default: the name of this project); CONFIG: the config to train (default:
# configs/{{ cookiecutter.dataset }}.yaml). Runs are written under the current folder.
set -euo pipefail
project="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
nnodes="${NNODES:-1}"
nproc_per_node="${NPROC_PER_NODE:-1}"
: "${RDZV_ENDPOINT:?set RDZV_ENDPOINT to host:port of one node, e.g. RDZV_ENDPOINT=node0:29500}"

exec torchrun \
    --nnodes "${nnodes}" \
    --nproc_per_node "${nproc_per_node}" \
    --rdzv_backend c10d \
    --rdzv_endpoint "${RDZV_ENDPOINT}" \
    --rdzv_id "${RDZV_ID:-{{ cookiecutter.project_slug }}}" \
    "${project}/main.py" fit \
    --config "${CONFIG:-${project}/configs/{{ cookiecutter.dataset }}.yaml}" \
    --config "${project}/configs/presets/ddp.yaml" \
    --trainer.num_nodes "${nnodes}" \
    --trainer.devices "${nproc_per_node}" \
    "$@"
