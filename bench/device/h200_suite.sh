#!/usr/bin/env bash
# One device call: calibrate the H200 machine, then executor throughput (with the compute-only
# ceiling and the measured traces for bench/speed/accuracy.py). Usage on the device machine:
#   bash bench/device/h200_suite.sh "$OUT"      (carry .whl: simpy for the simulator-side imports)
set -uo pipefail
out=${1:?output directory}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/simpy-*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
t0=$(date +%s)
python3 -c "from slide.cli import main; raise SystemExit(main(['calibrate', '--nvme-dir', '/tmp/nvme-probe', '--name', 'h200-16c-128g', '--out', '$out/h200-calibrated.toml']))" 2>&1 | tail -3
echo "calibrate: $(( $(date +%s) - t0 )) s"
run() { python3 -m bench.speed.train_throughput --machine "$out/h200-calibrated.toml" --traces traces --out "$out/throughput.jsonl" "$@" 2>&1 | grep -v "^INFO" ; }
run --model llama-3.2-3b --batch 8,16,32 --resident 0,auto --compute-only
echo "3b: $(( $(date +%s) - t0 )) s"
run --model llama-3.1-8b --batch 16,32 --resident 0 --compute-only
echo "8b: $(( $(date +%s) - t0 )) s"
tar czf "$out/traces.tgz" traces
