#!/usr/bin/env bash
# Session 10, last device call (under 8 minutes), on a fresh lease: issue 17's cold start again
# (llama-3.1-8b, 5 steps, no cached profile: the host AdamW kernel now builds beside the GPU
# probes), then issue 14's soak on the final code (the completions' lock gate): llama-3.2-3b
# batch 16, the defaults, 400 steps (SIGINT at 330 s if slower), the metrics every 10 steps,
# fitted by bench/memory/soak_plot.py.
#   carry [".clean"]; command: cd .clean && bash bench/device/h200_session10e.sh
source bench/device/h200_env.sh
source bench/device/h200_kept_runs.sh
stamp start
mkdir -p "$OUT/startup"
OUT="$OUT/startup" STARTUP_RUNS=cold timeout 150 bash bench/device/h200_startup.sh > "$OUT/startup.txt" 2>&1
cat "$OUT/startup/phases.txt"; grep -h "probes took\|kernel" "$OUT/startup/cold-log.txt"
stamp startup
tokens 8000000
timeout -k 20 -s INT 330 python3 -m slide.cli train --model llama-3.2-3b --data /tmp/tok.npy --batch 16 \
  --seq 1024 --steps 400 --no-progress --metrics "$OUT/soak3b.jsonl" --log-every 10 \
  > "$OUT/soak3b.json" 2> "$OUT/soak3b.err"
echo "rc=$?" >> "$OUT/soak3b.err"
tail -3 "$OUT/soak3b.err"; grep -E "steps_done|tokens_per_s|steady|step_time_error" "$OUT/soak3b.json"
python3 bench/memory/soak_plot.py "$OUT/soak3b.jsonl" --skip 80 --out "$OUT/soak3b.png" > "$OUT/soak3b-fit.txt" 2>&1; tail -8 "$OUT/soak3b-fit.txt"
stamp soak
bundle
