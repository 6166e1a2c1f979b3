#!/usr/bin/env bash
# Session 10, device call 1 (under 9 minutes), on a fresh lease: issue 17's start-up (llama-3.1-8b,
# 5 steps, cold then warm: h200_startup.sh, which must run first on the lease), then issue 15's
# figures with today's defaults: llama-3.1-8b and llama-3.2-3b batch 16, 12 steps (the summary's
# tokens/s over steps 7-10, after the re-plan check, and its step_time_error against the plan
# that ran), and the 8B once more with PyTorch's expandable segments (does the allocator's
# fragmentation at 99% of the GPU cost the early steps?).
#   carry [".clean"]; command: cd .clean && bash bench/device/h200_session10a.sh
source bench/device/h200_env.sh
source bench/device/h200_kept_runs.sh
stamp start
mkdir -p "$OUT/startup"
OUT="$OUT/startup" timeout 300 bash bench/device/h200_startup.sh > "$OUT/startup.txt" 2>&1
cat "$OUT/startup/phases.txt"
stamp startup
tokens 2000000
kept_run llama-3.1-8b auto 12 150
RUN_NAME=llama-3.1-8b-expandable PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True kept_run llama-3.1-8b auto 12 150
kept_run llama-3.2-3b auto 12 90
bundle
