#!/usr/bin/env bash
# Gradient clipping's cost on the H200: `slide train` with its defaults (placement search,
# --machine auto) at batch 16 seq 1024, 10 steps each, one lease; prints tokens/s, the prediction
# and its error, the plan, the summary's `clipping` (steps clipped, speculated units, steps
# rolled back) and its `memory` (peak RSS and GPU memory against the ledger). CASES picks the
# runs: one "label:flags" per line (default: llama-3.2-3b and llama-3.1-8b with per-unit and with
# global clipping); SF="3b 16" also runs the published
# SlideFormer code at that model and batch (carry .anchors, see ../shared/anchors/README.md).
#   bash bench/device/h200_clip.sh    (repo root; carry .whl; $OUT set)
set -uo pipefail
source bench/device/h200_env.sh
OUT=${OUT:?the device runner sets OUT}
python3 -c "import numpy as np; np.save('/tmp/tok.npy', np.random.default_rng(0).integers(0, 128000, 4_000_000))"
mkdir -p /tmp/clip
trap 'tar czf "$OUT/clip.tgz" -C /tmp/clip .' EXIT
CASES=${CASES:-"3b-per-unit:--model llama-3.2-3b --clip per-unit
3b-global:--model llama-3.2-3b
8b-per-unit:--model llama-3.1-8b --clip per-unit
8b-global:--model llama-3.1-8b"}
while IFS= read -r item; do
  label=${item%%:*}
  # shellcheck disable=SC2086
  timeout "${CASE_LIMIT:-150}" python3 -m slide.cli train --data /tmp/tok.npy --batch 16 --seq 1024 \
    --steps "${STEPS:-10}" --no-progress --save-trace "/tmp/clip/$label.trace.json" ${item#*:} \
    > "/tmp/clip/$label.json" 2> "/tmp/clip/$label.err"
  python3 -c "import json,sys; t=open(sys.argv[1]).read(); s=json.loads(t[t.index('{'):]); print(sys.argv[2], round(s['tokens_per_s']), s.get('predicted_tokens_per_s'), s.get('step_time_error'), s['placement'], s.get('clipping'), s.get('replan', {}).get('replanned'), s.get('memory'))" "/tmp/clip/$label.json" "$label" || tail -5 "/tmp/clip/$label.err"
  stamp "$label"
done <<< "$CASES"
if [ -n "${SF:-}" ]; then
  # shellcheck disable=SC2086
  timeout 300 bash .anchors/ext/drivers/run_sf.sh $SF > /tmp/clip/slideformer.json 2> /tmp/clip/slideformer.err
  tail -1 /tmp/clip/slideformer.json || tail -5 /tmp/clip/slideformer.err
  stamp slideformer
fi
