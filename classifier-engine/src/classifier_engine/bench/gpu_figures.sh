#!/usr/bin/env bash
# Every GPU figure docs/benchmarks.md asks for, in one go (about 10 minutes on one A100/H100-class GPU):
#   python -m classifier_engine.bench gpu_figures DATA_DIR [PATH/TO/airbench94.py]
# DATA_DIR holds cifar-10-python.tar.gz (add --data.verify_checksum=false to bench_recipe.py's line
# for your own images in that format). Each step's output goes to gpu-figures/<step>.txt (or $OUT);
# a failed step is reported at the end and the others still run.
set -uo pipefail
data_dir=${1:?usage: python -m classifier_engine.bench gpu_figures DATA_DIR [PATH/TO/airbench94.py]}
reference=${2:-}
out=${OUT:-gpu-figures}
mkdir -p "$out"
failed=""

step() {
    local name=$1
    shift
    echo "== $name: $*"
    "$@" 2>&1 | tee "$out/$name.txt" || failed="$failed $name"
}

step pytest_gpu python -m pytest -m gpu -q -p no:cacheprovider
step bench_recipe python -m classifier_engine.bench recipe --device cuda --seeds 5 --data_dir "$data_dir" \
    ${reference:+--reference "$reference"}
step bench_step_overhead python -m classifier_engine.bench step --overhead --device cuda
step bench_step_fast python -m classifier_engine.bench step --config configs/cifar10_fast.yaml --device cuda --rounds 3
step bench_infer python -m classifier_engine.bench infer --device cuda --data_dir "$data_dir"

if [ -n "$failed" ]; then
    echo "failed:$failed (see $out/)" >&2
    exit 1
fi
echo "all figures in $out/"
