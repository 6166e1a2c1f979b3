#!/usr/bin/env bash
# Session 11, second device call (under 9.5 minutes): issue 18's NVMe runs with calibrate's new
# probe (reads and overwrites in turn), `--activations nvme` and `--optimizer nvme-moments`
# (bench/device/h200_nvme.sh, 3 steps each), then issue 14's soak on the token staging ring
# (llama-3.2-1b, 1,024 steps or SIGINT at 200 s, the pinned host pool sampled beside RSS).
#   carry [".clean"]; command: cd .clean && bash bench/device/h200_session11b.sh
source bench/device/h200_env.sh
source bench/device/h200_kept_runs.sh
stamp start
mkdir -p "$OUT/nvme"
OUT="$OUT/nvme" RUNS="activations moments" STEPS=3 timeout 300 bash bench/device/h200_nvme.sh > "$OUT/nvme.txt" 2>&1
grep -E "^# nvme|step time|tokens_per_s|step_time_error|Maximum resident|^[123] |== " "$OUT/nvme.txt"
stamp nvme
NO_BUNDLE=1 SOAK_STEPS=1024 SOAK_LIMIT=200 SOAK_SKIPS="200 400" bash bench/device/h200_soak_long.sh
stamp all
bundle
