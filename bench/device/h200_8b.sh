#!/usr/bin/env bash
# The 8B half of the H200 suite (bench/device/h200_suite.sh), with the calibrated profile committed in
# bench/data/: llama-3.1-8b sliding at batch 16 and 32, resident=auto at 16, compute-only ceiling.
set -uo pipefail
out=${1:?output directory}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/simpy-*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m bench.speed.train_throughput --machine bench/data/h200-calibrated.toml --traces traces --out "$out/throughput.jsonl" \
  --model llama-3.1-8b --batch 16,32 --resident 0,auto --compute-only 2>&1 | grep -v "^INFO"
dmesg 2>/dev/null | grep -i -E "killed process|out of memory" | tail -3
tar czf "$out/traces.tgz" traces
