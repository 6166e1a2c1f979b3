#!/usr/bin/env bash
# The defaults' speed and prediction with and without kept autograd tapes, on the H200 (one
# device call): for each item of RUNS, `slide train` MODEL batch 16 seq 1024 with its defaults
# (--machine auto, the placement search) and `--keep-activations KEEP`, STEPS steps, stopped by
# SIGINT at LIMIT s; the GPU's memory sampled beside it (nvidia-smi every 0.5 s, torch's
# reserved/allocated in the metrics) and `slide plan`/`simulate` of the same flags on the cached
# profile (h200_kept_runs.sh: kept_run). NAME (optional) names the run's files.
# RUNS: "MODEL:KEEP:STEPS:LIMIT[:NAME]" items separated by spaces. bench/RESULTS.md's runs:
#   RUNS="llama-3.1-8b:auto:10:85 llama-3.1-8b:0:10:85 llama-3.2-3b:auto:12:60 llama-3.2-3b:0:12:60"
#   RUNS="llama-3.1-8b:auto:12:150 llama-3.2-3b:auto:12:90"       (the defaults' error, 12 steps)
#   PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True RUNS="llama-3.1-8b:auto:12:150:llama-3.1-8b-expandable"
# Run h200_startup.sh first in the same call for a cold start (it must find no cached profile).
#   carry [".clean"]; command: cd .clean && RUNS=... bash bench/device/h200_kept_tapes.sh
source bench/device/h200_env.sh
source bench/device/h200_kept_runs.sh
stamp start
tokens 2000000
for item in ${RUNS:-llama-3.2-3b:auto:12:90 llama-3.2-3b:0:12:90}; do
  IFS=: read -r model keep steps limit name <<< "$item"
  RUN_NAME=$name kept_run "$model" "$keep" "$steps" "$limit"
done
[ -n "${NO_BUNDLE:-}" ] || bundle
