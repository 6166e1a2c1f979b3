#!/usr/bin/env bash
# Issue 14 on the H200 (one device call, under 9 minutes): a soak long enough to pass the
# bounded early growth of host RSS (CPython's tuple free lists filling to their cap, a malloc
# arena's top: bench/RESULTS.md, session 10): llama-3.2-1b batch 16 seq 1024 with the
# defaults (0.27 s/step predicted), 1,536 steps (24 repetitions of the 64-step graph, so no
# shorter last pass re-plans at the end), the metrics every 16 steps, fitted by
# bench/memory/soak_plot.py after step 800 and after step 200. Stopped by SIGINT at 480 s.
# SOAK_STEPS, SOAK_LIMIT (s) and SOAK_SKIPS (the fits' first steps) change those.
#   carry [".clean"]; command: cd .clean && bash bench/device/h200_soak_long.sh
source bench/device/h200_env.sh
source bench/device/h200_kept_runs.sh
tokens 30000000
stamp start
timeout -k 30 -s INT "${SOAK_LIMIT:-480}" python3 -m slide.cli train --model llama-3.2-1b --data /tmp/tok.npy --batch 16 \
  --seq 1024 --steps "${SOAK_STEPS:-1536}" --no-progress --metrics "$OUT/soak1b.jsonl" --log-every 16 \
  > "$OUT/soak1b.json" 2> "$OUT/soak1b.err"
echo "rc=$?" >> "$OUT/soak1b.err"
tail -3 "$OUT/soak1b.err"; grep -E "steps_done|tokens_per_s|steady|step_time_error" "$OUT/soak1b.json"
for skip in ${SOAK_SKIPS:-200 800}; do
  python3 bench/memory/soak_plot.py "$OUT/soak1b.jsonl" --skip "$skip" --out "$OUT/soak1b-from-$skip.png" \
    > "$OUT/soak1b-fit-from-$skip.txt" 2>&1
  echo "== fit from step $skip"; cat "$OUT/soak1b-fit-from-$skip.txt"
done
stamp soak
[ -n "${NO_BUNDLE:-}" ] || bundle
