#!/usr/bin/env bash
# Session 11, first device call (under 8 minutes), on a fresh lease: issue 17's cold start
# (llama-3.1-8b, 5 steps, no cached profile) on the code whose resident units start on the device
# (fresh moments zero there, BF16 weights cast there: 3a8dcea), then the executor's GPU tests (they
# cover that change), then our host AdamW against DeepSpeed's CPUAdam on this host
# (bench/device/h200_cpu_adam.sh; carry .whl with DeepSpeed's sdist).
#   carry [".clean"]; command: cd .clean && bash bench/device/h200_session11a.sh
source bench/device/h200_env.sh
source bench/device/h200_kept_runs.sh
stamp start
mkdir -p "$OUT/startup" "$OUT/adam"
OUT="$OUT/startup" STARTUP_RUNS=cold timeout 150 bash bench/device/h200_startup.sh > "$OUT/startup.txt" 2>&1
cat "$OUT/startup/phases.txt"; grep -h "probes took\|kernel" "$OUT/startup/cold-log.txt"
stamp startup
timeout 150 python3 -m pytest -q -m gpu tests/executor -p no:cacheprovider > "$OUT/gpu-tests.txt" 2>&1
tail -5 "$OUT/gpu-tests.txt"
stamp gpu-tests
OUT="$OUT/adam" timeout 290 bash bench/device/h200_cpu_adam.sh > "$OUT/cpu-adam.txt" 2>&1
grep -v "^W[0-9]" "$OUT/cpu-adam.txt" | tail -40
stamp cpu-adam
bundle
