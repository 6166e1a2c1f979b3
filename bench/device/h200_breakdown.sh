#!/usr/bin/env bash
# Where a step's time goes, measured: `slide train` with its defaults on llama-3.2-3b and
# llama-3.1-8b at batch 16 seq 1024, and 3B with `--placement small`, 10 steps each, the trace
# of steps 7-10 saved; CASES picks other runs (Slide's format). bench/speed/step_breakdown.py reads the traces.
#   bash bench/device/h200_breakdown.sh    (repo root; carry .whl; $OUT set)
set -uo pipefail
source bench/device/h200_env.sh
OUT=${OUT:?the device runner sets OUT}
python3 -c "import numpy as np; np.save('/tmp/tok.npy', np.random.default_rng(0).integers(0, 128000, 4_000_000))"
mkdir -p /tmp/bd
# CASES (optional): "label:flags" items, one per line; the shape flags override the defaults'.
CASES=${CASES:-"3b-defaults:--model llama-3.2-3b
8b-defaults:--model llama-3.1-8b
3b-small:--model llama-3.2-3b --placement small"}
while IFS= read -r item; do
  label=${item%%:*}
  # shellcheck disable=SC2086
  timeout 150 python3 -m slide.cli train --data /tmp/tok.npy --batch 16 --seq 1024 --steps 10 \
    --no-progress --save-trace "/tmp/bd/$label.trace.json" ${item#*:} > "/tmp/bd/$label.json" 2> "/tmp/bd/$label.err"
  python3 -c "import json,sys; t=open(sys.argv[1]).read(); s=json.loads(t[t.index('{'):]); print(sys.argv[2], round(s['tokens_per_s']), s.get('step_time_error'), s['placement'])" "/tmp/bd/$label.json" "$label"
  stamp "$label"
done <<< "$CASES"
tar czf "$OUT/breakdown.tgz" -C /tmp/bd .
