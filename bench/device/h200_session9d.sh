#!/usr/bin/env bash
# Session 9, device call 4: issue 14's soak again after the re-plan fix (call 3's failed at step 7):
# llama-3.2-3b batch 16 seq 1024, the defaults and --keep-activations auto, 420 steps (SIGINT at
# 380 s if slower); the metrics every 10 steps come back, fitted here by bench/memory/soak_plot.py.
source bench/device/h200_env.sh
source bench/device/h200_kept_runs.sh
tokens 8000000
stamp start
timeout -k 30 -s INT 380 python3 -m slide.cli train --model llama-3.2-3b --data /tmp/tok.npy --batch 16 \
  --seq 1024 --steps 420 --keep-activations auto --no-progress --metrics "$OUT/soak3b.jsonl" \
  --log-every 10 > "$OUT/soak3b.json" 2> "$OUT/soak3b.err"
echo "rc=$?" >> "$OUT/soak3b.err"
tail -3 "$OUT/soak3b.err"; cat "$OUT/soak3b.json"
stamp soak
