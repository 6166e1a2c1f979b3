#!/usr/bin/env bash
# Issue 14 on the H200 (one device call, under 9 minutes): a soak long enough to pass the
# bounded early growth of host RSS (a malloc arena's top; CPython's tuple free lists, which the
# executor fills after step 1 since session 12: bench/RESULTS.md, sessions 10 and 12): SOAK_MODEL (default llama-3.2-1b, 0.24 s/step)
# batch 16 seq 1024 with the defaults, SOAK_STEPS steps (default 1,536: the re-plan check's
# 6-step pass, 23 whole 64-step passes and a 58-step last pass, whose engine is made before the
# steady state since session 11), the metrics every 16 steps with RSS and the pinned host pool
# sampled, fitted by bench/memory/soak_plot.py from each step in SOAK_SKIPS (default 200 800),
# and the samples where RSS or the pool moved. Stopped by SIGINT at SOAK_LIMIT s (default 480).
# SOAK_ARGS: more `slide train` flags, after the defaults' (a later --batch/--seq wins);
# SOAK_LOG_EVERY (default 16); SOAK_VOCAB (default 128000: token ids below it); NO_BUNDLE=1
# leaves the files unpacked (when another script bundles). The soaks of bench/RESULTS.md:
#   3B, 600 steps:   SOAK_MODEL=llama-3.2-3b SOAK_STEPS=600 SOAK_LIMIT=470 SOAK_SKIPS="200 400"
#   1B, 358 steps:   SOAK_STEPS=358 SOAK_LIMIT=200 SOAK_SKIPS="100 200"
#   3B, 400 steps, every 10 (sessions 6-10): SOAK_MODEL=llama-3.2-3b SOAK_STEPS=400 SOAK_LIMIT=400 \
#                    SOAK_LOG_EVERY=10 SOAK_SKIPS=80
#   tiny, all sliding: SOAK_MODEL=tiny-llama SOAK_VOCAB=500 SOAK_STEPS=4000 SOAK_LIMIT=120 \
#                    SOAK_LOG_EVERY=100 SOAK_ARGS="--placement small --batch 4 --seq 256"
#   carry [".clean"]; command: cd .clean && bash bench/device/h200_soak_long.sh
source bench/device/h200_env.sh
source bench/device/h200_kept_runs.sh
tokens 30000000 "${SOAK_VOCAB:-128000}"
stamp start
name=soak-${SOAK_MODEL:-llama-3.2-1b}
# shellcheck disable=SC2086
timeout -k 30 -s INT "${SOAK_LIMIT:-480}" python3 -m slide.cli train --model "${SOAK_MODEL:-llama-3.2-1b}" \
  --data /tmp/tok.npy --batch 16 --seq 1024 --steps "${SOAK_STEPS:-1536}" --no-progress \
  --metrics "$OUT/$name.jsonl" --log-every "${SOAK_LOG_EVERY:-16}" ${SOAK_ARGS:-} > "$OUT/$name.json" 2> "$OUT/$name.err"
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
