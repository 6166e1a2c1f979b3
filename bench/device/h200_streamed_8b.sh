#!/usr/bin/env bash
# One device call: streamed updates on llama-3.2-3b (b8/16/32, the count the planner picks and a
# fixed one) and on llama-3.1-8b (b8/16/32), each with its compute-only ceiling; traces and
# plans tarred for bench/speed/accuracy.py.   bash bench/device/h200_streamed_8b.sh "$OUT"   (carry .whl)
set -uo pipefail
out=${1:?output directory}
source bench/device/h200_env.sh
run() { python3 -m bench.speed.train_throughput --machine bench/data/h200-calibrated.toml --traces "$out/traces" --out "$out/throughput.jsonl" "$@" 2>&1 | grep -v "^INFO" | cut -c1-330 ; }
run --model llama-3.2-3b --batch 32 --variants streamed=auto
stamp 3b-b32
run --model llama-3.2-3b --batch 16 --variants streamed=auto,streamed=8,streamed=auto+cpu_threads=10
stamp 3b-b16
run --model llama-3.2-3b --batch 8 --variants streamed=auto
stamp 3b-b8
run --model llama-3.1-8b --batch 16 --variants streamed=auto --compute-only
stamp 8b-b16
run --model llama-3.1-8b --batch 8,32 --variants streamed=auto --compute-only
stamp 8b-b8-32
dmesg 2>/dev/null | grep -i -E "killed process|out of memory" | tail -3
tar czf "$out/traces.tgz" -C "$out" traces && rm -rf "$out/traces"
