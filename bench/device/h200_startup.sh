#!/usr/bin/env bash
# Issue 17, start-up and shutdown on the H200: `slide train` exactly as a user runs it (its
# defaults: --machine auto, the placement search), llama-3.1-8b batch 16 seq 1024, 5 steps on
# random token ids from a .npy file, twice: the first on a fresh machine (no cached host
# profile, the host AdamW kernel not yet compiled), the second with both cached. Prints each
# run's phase table (the summary's `startup` and `shutdown`, from `-v` timing) and the wall
# time of the whole command; targets: command to first step <= 45 s, whole run <= 75 s.
#   [STARTUP_RUNS=cold] bash bench/device/h200_startup.sh   (from the repo root; carry .whl: simpy; $OUT set)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/simpy-*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:?the device runner sets OUT}
mkdir -p "$OUT"
TOKENS=/tmp/slide-startup-tokens.npy
# a dry run on a CPU: MODEL=tiny-llama VOCAB=512 ARGS="--device cpu --batch 2 --seq 32"
MODEL=${MODEL:-llama-3.1-8b} VOCAB=${VOCAB:-128000} ARGS=${ARGS:-}
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  free -g
  echo "cpus $(nproc)"
  python3 -c "import torch; print('torch', torch.__version__)"
  git log -1 --oneline 2>/dev/null
} > "$OUT/env.txt" 2>&1
# random token ids below llama-3's vocabulary (128256): 200k tokens, 12 batches of 16 x 1024
python3 -c "import numpy as np, sys; np.save(sys.argv[1], np.random.default_rng(0).integers(0, int(sys.argv[2]), size=200_000, dtype=np.int64))" "$TOKENS" "$VOCAB" || exit 1

run() {  # run TAG: one 5-step training, its wall time, its phase table
  local tag=$1 start end
  start=$(date +%s.%N)
  # shellcheck disable=SC2086
  timeout -s INT 290 python3 -m slide.cli -v train --model "$MODEL" --batch 16 --seq 1024 \
    --steps 5 --data "$TOKENS" --no-progress --metrics "$OUT/$tag-metrics.jsonl" $ARGS \
    > "$OUT/$tag-summary.json" 2> "$OUT/$tag-log.txt"
  echo "exit $?" >> "$OUT/$tag-log.txt"
  end=$(date +%s.%N)
  python3 - "$OUT/$tag-summary.json" "$tag" "$start" "$end" <<'EOF' | tee -a "$OUT/phases.txt"
import json, sys
path, tag = sys.argv[1], sys.argv[2]
wall = float(sys.argv[4]) - float(sys.argv[3])
try:
    s = json.load(open(path))
except (OSError, ValueError) as e:
    print(f"{tag}: no summary ({e}); see {tag}-log.txt"); sys.exit()
print(f"== {tag}: whole command {wall:.1f} s (target <= 75), command to first step "
      f"{s['startup']['to_first_step_s']:.1f} s (target <= 45), {s['tokens_per_s']:,.0f} tokens/s")
for part in ("startup", "shutdown"):
    for k, v in s[part].items():
        print(f"  {part:9s} {k:42s} {v:8.2f}")
EOF
}
for tag in ${STARTUP_RUNS:-cold warm}; do run "$tag"; done
grep -h "INFO host AdamW\|INFO machine\|WARNING\|Error" "$OUT"/cold-log.txt "$OUT"/warm-log.txt | head -20
