#!/usr/bin/env bash
# Build TensorRT engines from the files export.py wrote, on the GPU that will run them (an engine is
# tuned for the GPU it is built on and cannot be moved to another model of GPU).
#
#   scripts/tensorrt_engine.sh EXPORT_DIR [MAX_BATCH]
#
# Writes EXPORT_DIR/model.fp16.plan (from model.onnx, fp16 kernels allowed) and, when
# model.int8.onnx is there, EXPORT_DIR/model.int8.plan (its QDQ scales decide the int8 layers:
# export it with --int8_symmetric, TensorRT takes symmetric activations only). The optimization
# profile covers batches 1 to MAX_BATCH (default 4096, the exported graphs' limit), tuned for 256.
# Needs trtexec (TensorRT's command-line tool, e.g. from NVIDIA's TensorRT container) on PATH.
set -euo pipefail
export_dir="${1:?usage: scripts/tensorrt_engine.sh EXPORT_DIR [MAX_BATCH]}"
max_batch="${2:-4096}"
command -v trtexec >/dev/null || { echo "error: trtexec is not on PATH; install TensorRT (or use its container) and run again" >&2; exit 2; }
[[ -f "$export_dir/model.onnx" ]] || { echo "error: no model.onnx in $export_dir; run python export.py first" >&2; exit 2; }
# The image size the model was trained at, as the model card records it (input shape: batch, 3, S, S).
size=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["input"]["shape"][2])' "$export_dir/model.card.json")
shapes=("--minShapes=images:1x3x${size}x${size}" "--optShapes=images:256x3x${size}x${size}" "--maxShapes=images:${max_batch}x3x${size}x${size}")
trtexec --onnx="$export_dir/model.onnx" --saveEngine="$export_dir/model.fp16.plan" --fp16 "${shapes[@]}"
if [[ -f "$export_dir/model.int8.onnx" ]]; then
  trtexec --onnx="$export_dir/model.int8.onnx" --saveEngine="$export_dir/model.int8.plan" --int8 --fp16 "${shapes[@]}"
fi
