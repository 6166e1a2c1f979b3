#!/usr/bin/env bash
# One short call whatever card comes: on an H200 the issue figures of the lean tape (3B and 8B
# defaults, 8B per-unit, this tree only); on another card pure sliding (3B b16 `--placement small
# --clip none`) beside the published SlideFormer code in the same lease.
#   cp -r ../shared/anchors .anchors; carry [".whl", ".anchors"]; bash bench/device/h200_last_call.sh
source bench/device/h200_env.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $gpu"
B16="--batch,16,--seq,1024"
if [[ $gpu == *H200* ]]; then
  TREES=after STEPS=12 ROUNDS=1 \
    CASES="3b-defaults:--model,llama-3.2-3b,$B16;8b-defaults:--model,llama-3.1-8b,$B16;8b-per-unit:--model,llama-3.1-8b,$B16,--clip,per-unit" \
    bash bench/device/h200_before_after.sh
else
  TREES=after STEPS=12 ROUNDS=1 CASES="3b-small:--model,llama-3.2-3b,$B16,--placement,small,--clip,none" \
    bash bench/device/h200_before_after.sh
  timeout 200 bash .anchors/ext/drivers/run_sf.sh 3b 16
fi
