#!/usr/bin/env bash
# The lean tape (a recompute without the MLP's tail; no SwiGLU product, layer output or whole
# q/k/v projection kept) on the H200, one call: its bit-for-bit backward and the SwiGLU kernels
# on CUDA, a layer's held and peak bytes against the ledger (bench/memory/layer_memory.py), then
# `slide train` before (.before, the tree without it) and after through h200_before_after.sh.
#   rm -rf .before && mkdir .before && git archive be0a3a0 | tar -x -C .before
#   carry [".whl", ".before"]; command: bash bench/device/h200_lean_tapes.sh
set -uo pipefail
source bench/device/h200_env.sh
OUT=${OUT:?the device runner sets OUT}
mkdir -p "$OUT/checks"
timeout 150 python3 -m pytest -q tests/executor/test_layers.py tests/slide_kernels/test_swiglu.py \
  -p no:cacheprovider > "$OUT/checks/cuda_tests.txt" 2>&1
tail -2 "$OUT/checks/cuda_tests.txt"
stamp cuda-tests
timeout 100 python3 -m bench.memory.layer_memory > "$OUT/checks/layer_memory.txt" 2>&1
cat "$OUT/checks/layer_memory.txt"
stamp layer-memory
B16="--batch,16,--seq,1024"
CASES=${CASES:-"8b-global:--model,llama-3.1-8b,$B16;8b-per-unit:--model,llama-3.1-8b,$B16,--clip,per-unit;3b-global:--model,llama-3.2-3b,$B16"} \
  ROUNDS=${ROUNDS:-1} STEPS=${STEPS:-12} bash bench/device/h200_before_after.sh
