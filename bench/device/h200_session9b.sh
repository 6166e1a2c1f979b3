#!/usr/bin/env bash
# Session 9, device call 2 (under 8 minutes): issue 16's before/after (h200_ir_before_after.sh:
# llama-3.2-3b defaults and --placement small, this tree against d3d7e18, alternating, 10 steps
# each), then llama-3.2-3b with `--keep-activations auto` and 0 (issue 15), as in call 1.
#   rm -rf .before && mkdir .before && git archive d3d7e18 | tar -x -C .before
#   carry [".whl", ".before"]; command: bash bench/device/h200_session9b.sh
source bench/device/h200_env.sh
source bench/device/h200_kept_runs.sh
stamp start
mkdir -p "$OUT/before_after"
OUT="$OUT/before_after" timeout 380 bash bench/device/h200_ir_before_after.sh > "$OUT/before_after.txt" 2>&1
tail -12 "$OUT/before_after.txt"
rm -f "$OUT/before_after/all.tgz"
stamp before-after
tokens 2000000
kept_run llama-3.2-3b auto 12 60
kept_run llama-3.2-3b 0 12 60
bundle
