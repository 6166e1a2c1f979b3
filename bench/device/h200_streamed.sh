#!/usr/bin/env bash
# One device call (llama-3.2-3b): GPU tests of the executor, calibrate (with the host update
# measured under DMA load), then throughput of pure sliding and streamed updates at several
# batches with the compute-only ceiling, traces and saved plans for bench/speed/accuracy.py.
#   bash bench/device/h200_streamed.sh "$OUT"      (carry .whl: simpy)
set -uo pipefail
out=${1:?output directory}
source bench/device/h200_env.sh
python3 -m pytest tests/executor/test_gpu.py -q -x -s 2>&1 | grep -E "passed|failed|Error|error|loss err|cudaMalloc" | tail -8
stamp tests
python3 -c "from slide.cli import main; raise SystemExit(main(['calibrate', '--name', 'h200-16c-128g', '--out', '$out/h200-calibrated.toml']))" 2>&1 | tail -2
grep "^# adam" "$out/h200-calibrated.toml"
stamp calibrate
run() { python3 -m bench.speed.train_throughput --model llama-3.2-3b --machine bench/data/h200-calibrated.toml --traces "$out/traces" --out "$out/throughput.jsonl" "$@" 2>&1 | grep -v "^INFO" | cut -c1-400 ; }
run --batch 16 --variants pure,streamed=auto,streamed=8,streamed=auto+cpu_threads=12 --compute-only
stamp b16
run --batch 8,32 --variants streamed=auto --compute-only
stamp b8-32
run --batch 64,48 --variants pure --compute-only
stamp b64-48
run --batch 4 --variants streamed=auto,pure --compute-only
stamp b4
