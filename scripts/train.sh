#!/usr/bin/env bash
# The main job on a fresh machine with only Python 3 (>= 3.10): render this template with its
# default answers into build/, install the rendered project into build/.venv, and train it with
# `python main.py fit --config configs/cifar10.yaml`.
#
# The CIFAR-10 archive is taken from DATA_DIR (default: build/cifar-classifier/data) when
# cifar-10-python.tar.gz is there, and downloaded otherwise. Extra arguments go to main.py,
# e.g. `scripts/train.sh --trainer.max_epochs 5`.
set -euo pipefail
template="$(cd "$(dirname "$0")/.." && pwd)"
build="$template/build"
mkdir -p "$build"
python3 -m venv "$build/.venv"
python="$build/.venv/bin/python"
"$python" -m pip install -q --upgrade pip
"$python" -m pip install -q "cookiecutter>=2.6,<3" "torch==2.14.1" "torchvision==0.29.1"
# Re-rendering over an earlier render keeps its data/ and runs/ (they are not template files).
"$python" -m cookiecutter --no-input --overwrite-if-exists -o "$build" "$template"
project="$build/cifar-classifier"
"$python" -m pip install -q -c "$project/constraints.txt" -e "$project"  # the locked versions, as its README installs
cd "$project"
data_dir="${DATA_DIR:-$project/data}"
exec "$python" main.py fit --config configs/cifar10.yaml --data.data_dir "$data_dir" "$@"
