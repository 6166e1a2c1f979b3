#!/usr/bin/env bash
# The 24 GB-class GPU case on whatever card comes, one lease: llama-3.2-3b batch 16 through
# `slide train` capped by `--gpu-memory-gb 24` (the plan and torch's allocator, `slide/gpu_cap.py`)
# with and without global clipping, pure sliding (`--placement small`), and the published
# SlideFormer code (`run_sf.sh 3b 16`) beside them; then the same cap on llama-3.1-8b.
#   cp -r ../shared/anchors .anchors; carry [".whl", ".anchors"]; bash bench/device/sliding_24gb.sh
source bench/device/h200_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1
B16="--batch,16,--seq,1024"
CAP="--gpu-memory-gb,24"
TREES=after STEPS=${STEPS:-12} ROUNDS=1 CASES=${CASES:-"3b-24g-none:--model,llama-3.2-3b,$B16,$CAP,--clip,none;3b-24g-global:--model,llama-3.2-3b,$B16,$CAP;3b-small-none:--model,llama-3.2-3b,$B16,--placement,small,--clip,none;8b-24g-global:--model,llama-3.1-8b,$B16,$CAP"} \
  bash bench/device/h200_before_after.sh
stamp slide
timeout 200 bash .anchors/ext/drivers/run_sf.sh 3b 16 > "$OUT/slideformer-3b-16.txt" 2>&1
tail -5 "$OUT/slideformer-3b-16.txt"
stamp slideformer
