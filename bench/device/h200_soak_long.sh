#!/usr/bin/env bash
# Issue 14 on the H200 (one device call, under 9 minutes): a soak long enough to pass the
# bounded early growth of host RSS (a malloc arena's top; CPython's tuple free lists, which the
# executor fills after step 1 since session 12: bench/RESULTS.md, sessions 10 and 12): SOAK_MODEL (default llama-3.2-1b, 0.24 s/step)
# batch 16 seq 1024 with the defaults, SOAK_STEPS steps (default 1,536: the re-plan check's
# 6-step pass, 23 whole 64-step passes and a 58-step last pass, whose engine is made before the
# steady state since session 11), the metrics every 16 steps with RSS and the pinned host pool
# sampled, fitted by bench/memory/soak_plot.py from each step in SOAK_SKIPS (default 200 800),
# and the samples where RSS or the pool moved. Stopped by SIGINT at SOAK_LIMIT s (default 480).
#   carry [".clean"]; command: cd .clean && bash bench/device/h200_soak_long.sh
source bench/device/h200_env.sh
source bench/device/h200_kept_runs.sh
tokens 30000000
stamp start
name=soak-${SOAK_MODEL:-llama-3.2-1b}
timeout -k 30 -s INT "${SOAK_LIMIT:-480}" python3 -m slide.cli train --model "${SOAK_MODEL:-llama-3.2-1b}" \
  --data /tmp/tok.npy --batch 16 --seq 1024 --steps "${SOAK_STEPS:-1536}" --no-progress \
  --metrics "$OUT/$name.jsonl" --log-every 16 > "$OUT/$name.json" 2> "$OUT/$name.err"
echo "rc=$?" >> "$OUT/$name.err"
tail -3 "$OUT/$name.err"; grep -E "steps_done|tokens_per_s|steady|step_time_error" "$OUT/$name.json"
for skip in ${SOAK_SKIPS:-200 800}; do
  python3 bench/memory/soak_plot.py "$OUT/$name.jsonl" --skip "$skip" --out "$OUT/$name-from-$skip.png" \
    > "$OUT/$name-fit-from-$skip.txt" 2>&1
  echo "== fit from step $skip"; cat "$OUT/$name-fit-from-$skip.txt"
done
python3 - "$OUT/$name.jsonl" <<'PY'
import json, sys
prev = None
for r in map(json.loads, open(sys.argv[1])):
    if "host_rss_bytes" not in r:
        continue
    now = (r["host_rss_bytes"], r.get("host_pinned_pool_bytes"))
    if now != prev:
        print(r["step"], f"rss {now[0] / 1e6:.3f} MB", f"pinned pool {now[1]}", f"step {r['step_time_s']:.3f} s")
    prev = now
PY
stamp soak
[ -n "${NO_BUNDLE:-}" ] || bundle
