#!/usr/bin/env bash
# Global-norm clipping against per-unit and none on the default path: `slide train` with its
# defaults (placement search, --machine preset) on llama-3.2-3b and llama-3.1-8b at batch 16
# seq 1024, 10 steps each, one lease; prints tokens/s, the summary's step_time_error and the plan.
#   bash bench/device/h200_clip.sh    (repo root; carry .whl; $OUT set)
set -uo pipefail
source bench/device/h200_env.sh
OUT=${OUT:?the device runner sets OUT}
python3 -c "import numpy as np; np.save('/tmp/tok.npy', np.random.default_rng(0).integers(0, 128000, 4_000_000))"
mkdir -p /tmp/clip
MODELS=${MODELS:-"llama-3.2-3b llama-3.1-8b"}
MODES=${MODES:-"none per-unit global"}
EXTRA=${EXTRA:-}
for model in $MODELS; do
  for mode in $MODES; do
    label="$model-$mode"
    # shellcheck disable=SC2086
    timeout 180 python3 -m slide.cli train --data /tmp/tok.npy --model "$model" --batch 16 --seq 1024 \
      --steps 10 --no-progress --clip "$mode" --save-trace "/tmp/clip/$label.trace.json" $EXTRA \
      > "/tmp/clip/$label.json" 2> "/tmp/clip/$label.err"
    python3 -c "import json,sys; t=open(sys.argv[1]).read(); s=json.loads(t[t.index('{'):]); print(sys.argv[2], round(s['tokens_per_s']), s.get('step_time_error'), s.get('predicted_tokens_per_s'), s['placement'])" "/tmp/clip/$label.json" "$label" || tail -5 "/tmp/clip/$label.err"
    stamp "$label"
  done
done
tar czf "$OUT/clip.tgz" -C /tmp/clip .
