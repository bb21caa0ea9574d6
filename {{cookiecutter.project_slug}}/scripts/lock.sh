#!/usr/bin/env bash
# Refresh the two lock files from pyproject.toml, for every Python the project supports (3.10 and
# newer) on Linux, macOS and Windows, in one resolution (uv's universal mode; plain pip reads it):
#   constraints.txt      torch's default wheels (on Linux: the CUDA build and its nvidia-* packages)
#   constraints-cpu.txt  the same pins, with torch's CPU build on Linux and no CUDA package at all
# The current pins are kept unless asked: `scripts/lock.sh --upgrade` moves everything to its newest
# version, `scripts/lock.sh --upgrade-package lightning` one package; `-c pins.txt` (a file holding e.g.
# `torch==2.14.1`) holds a package back. Extra arguments go to uv.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v uv >/dev/null || { echo "error: uv is not installed; pip install uv" >&2; exit 2; }
trap 'rm -f constraints.txt.new engine-source.txt.new engine-pinned.txt.new' EXIT  # nothing left behind, even on failure

# The pins of the current lock are the resolver's preferences (uv reads the output file's pins): without
# --upgrade or --upgrade-package, an unchanged pyproject.toml gives the same lock, byte for byte.
grep -v '^#' constraints.txt > constraints.txt.new 2>/dev/null || true
# classifier-engine comes from where the lock says (this template's checkout, or its git commit), at the
# release the lock pins (pyproject.toml states the compatible range); both lines stay in the lock.
# scripts/upgrade_engine.sh moves both.
engine=$(grep -E '^classifier-engine==' constraints.txt | head -1)
grep -E '^classifier-engine @ ' constraints.txt > engine-source.txt.new || true  # none: from the package index
uv pip compile pyproject.toml --extra dev --universal --python-version 3.10 \
    --no-annotate --no-header --quiet -c engine-source.txt.new "$@" --output-file constraints.txt.new
awk -v pin="${engine}" '/^classifier-engine @ /{print pin} {print}' constraints.txt.new > engine-pinned.txt.new
mv engine-pinned.txt.new constraints.txt.new
rm engine-source.txt.new
{
    echo "# Exact versions of every dependency, for Python >= 3.10 on Linux, macOS and Windows (scripts/lock.sh)."
    echo "# Install: pip install -c constraints.txt -e \".[dev]\"   (on Linux this is torch's CUDA build)"
    cat constraints.txt.new
} > constraints.txt

torch=$(grep -E '^torch==' constraints.txt.new | cut -d' ' -f1 | cut -d= -f3)
torchvision=$(grep -E '^torchvision==' constraints.txt.new | cut -d' ' -f1 | cut -d= -f3)
{
    echo "# constraints.txt without CUDA: torch's CPU build on Linux (from PyTorch's CPU index), no nvidia-* package."
    echo "# Install: pip install --extra-index-url https://download.pytorch.org/whl/cpu -c constraints-cpu.txt -e \".[dev]\""
    grep -vE '^(nvidia-|cuda-|triton==|torch==|torchvision==)' constraints.txt.new
    echo "torch==${torch}+cpu ; sys_platform == 'linux'"
    echo "torch==${torch} ; sys_platform != 'linux'"
    echo "torchvision==${torchvision}+cpu ; sys_platform == 'linux'"
    echo "torchvision==${torchvision} ; sys_platform != 'linux'"
} > constraints-cpu.txt
rm constraints.txt.new
echo "wrote constraints.txt and constraints-cpu.txt"
