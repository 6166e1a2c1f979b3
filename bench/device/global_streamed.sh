#!/usr/bin/env bash
# Streamed units under global clipping (post_norm), whatever card comes, one lease: the default
# path (`--clip global`) before (.before) and after on the memory-bound cases, where the host's
# updates after the norm bound the step: llama-3.1-8b b16 on the card's whole memory and
# llama-3.2-3b b16 under `--gpu-memory-gb 24`; then this tree's per-unit and no-clipping runs of
# the same shapes beside them (issue 32's "global within 3% of per-unit").
#   rm -rf .before && mkdir .before && git archive COMMIT | tar -x -C .before
#   carry [".whl", ".before", ".anchors"]; PART=1 bash bench/device/global_streamed.sh; then PART=2
#   (cp -r ../shared/anchors .anchors for the SlideFormer run)
source bench/device/h200_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1
B16="--batch,16,--seq,1024"
if [ "${PART:-1}" = 7 ]; then  # the landed version: issue 32's pair at 8B, the 24 GB case, 3B defaults
  TREES=after STEPS=12 ROUNDS=1 CASES="8b-defaults:--model,llama-3.1-8b,$B16;8b-per-unit:--model,llama-3.1-8b,$B16,--clip,per-unit;3b-24g-global:--model,llama-3.2-3b,$B16,--gpu-memory-gb,24;3b-defaults:--model,llama-3.2-3b,$B16" \
    bash bench/device/h200_before_after.sh
elif [ "${PART:-1}" = 6 ]; then  # part 5's first two, the shorter first (a short device budget)
  TREES=after STEPS=12 ROUNDS=1 CASES="3b-24g-global:--model,llama-3.2-3b,$B16,--gpu-memory-gb,24;8b-defaults:--model,llama-3.1-8b,$B16" \
    bash bench/device/h200_before_after.sh
elif [ "${PART:-1}" = 5 ]; then  # the updates after the norm on the h2d lane (no cross-step ops)
  TREES=after STEPS=12 ROUNDS=1 CASES="8b-defaults:--model,llama-3.1-8b,$B16;3b-24g-global:--model,llama-3.2-3b,$B16,--gpu-memory-gb,24;8b-per-unit:--model,llama-3.1-8b,$B16,--clip,per-unit" \
    bash bench/device/h200_before_after.sh
elif [ "${PART:-1}" = 4 ]; then  # issue 32 in one lease: global (the default) against per-unit, 8B and 3B
  TREES=after STEPS=12 ROUNDS=1 CASES="8b-global:--model,llama-3.1-8b,$B16;8b-per-unit:--model,llama-3.1-8b,$B16,--clip,per-unit;3b-global:--model,llama-3.2-3b,$B16;3b-per-unit:--model,llama-3.2-3b,$B16,--clip,per-unit" \
    bash bench/device/h200_before_after.sh
elif [ "${PART:-1}" = 3 ]; then  # this tree's defaults (8B, 3B), pure sliding, SlideFormer, one lease
  TREES=after STEPS=12 ROUNDS=1 CASES="8b-defaults:--model,llama-3.1-8b,$B16;3b-defaults:--model,llama-3.2-3b,$B16;3b-small-none:--model,llama-3.2-3b,$B16,--placement,small,--clip,none" \
    bash bench/device/h200_before_after.sh
  timeout 200 bash .anchors/ext/drivers/run_sf.sh 3b 16 > "$OUT/slideformer-3b-16.txt" 2>&1
  tail -3 "$OUT/slideformer-3b-16.txt"
elif [ "${PART:-1}" = 1 ]; then
  STEPS=12 ROUNDS=1 CASES="8b-global:--model,llama-3.1-8b,$B16;3b-24g-global:--model,llama-3.2-3b,$B16,--gpu-memory-gb,24" \
    bash bench/device/h200_before_after.sh
else  # this tree: 8B per-unit, 8B global with streamed units pinned, 3B at 24 GB unclipped, SlideFormer
  TREES=after STEPS=12 ROUNDS=1 CASES="8b-per-unit:--model,llama-3.1-8b,$B16,--clip,per-unit;8b-global-pinned:--model,llama-3.1-8b,$B16,--resident,12,--streamed,15,--speculate,0;3b-24g-none:--model,llama-3.2-3b,$B16,--gpu-memory-gb,24,--clip,none" \
    bash bench/device/h200_before_after.sh
  cp /tmp/slide-cache-*/slide/machines/*.toml "$OUT/" 2>/dev/null
  timeout 200 bash .anchors/ext/drivers/run_sf.sh 3b 16 > "$OUT/slideformer-3b-16.txt" 2>&1
  tail -3 "$OUT/slideformer-3b-16.txt"
fi
stamp done
