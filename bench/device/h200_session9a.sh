#!/usr/bin/env bash
# Session 9, device call 1 (under 9 minutes; everything bundled into $OUT/all.tgz):
#   1. the GPU tests (`pytest -m gpu tests/executor tests/kernels`): everything since d3d7e18 on
#      CUDA (the folder split, the sharded-buffer code paths at one rank, reused events);
#   2. bench/device/h200_startup.sh: llama-3.1-8b batch 16, 5 steps, fresh then cached (issue 17);
#   3. llama-3.1-8b batch 16 seq 1024 as a user runs it (--machine auto, now cached), with
#      `--keep-activations auto` and with 0 (today's default), 10 steps each: tokens/s, the GPU's
#      memory (nvidia-smi every 0.5 s, torch's reserved/allocated every 2 steps) against the
#      ledger, and the prediction (`slide simulate`) on the same cached profile (issue 15).
#   bash bench/device/h200_session9a.sh        (carry .whl: simpy; $OUT set)
source bench/device/h200_env.sh
source bench/device/h200_kept_runs.sh
stamp start
timeout 150 python3 -m pytest -q -m gpu tests/executor tests/kernels -p no:cacheprovider \
  > "$OUT/gpu_tests.txt" 2>&1; echo "rc=$?" >> "$OUT/gpu_tests.txt"
tail -3 "$OUT/gpu_tests.txt"
stamp gpu-tests
mkdir -p "$OUT/startup"
OUT="$OUT/startup" timeout 190 bash bench/device/h200_startup.sh > "$OUT/startup.txt" 2>&1
tail -30 "$OUT/startup.txt"
stamp startup
tokens 2000000
kept_run llama-3.1-8b auto 10 85
kept_run llama-3.1-8b 0 10 85
bundle
