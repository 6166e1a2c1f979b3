#!/usr/bin/env bash
# After a change to the executor or the cost model, one device call: the GPU tests (kernels,
# executor, slide), the host curves priced against measured (bench/speed/host_curves.py), and a
# cold `--machine auto` start of llama-3.1-8b (the shape grid's `cold` group: its seconds to the
# first step and its step against the prediction). Results under $OUT, logs in $OUT/logs.tgz.
#   bash bench/device/h200_checks_after_change.sh    (repo root; carry .whl; $OUT set)
set -uo pipefail
source bench/device/h200_env.sh
OUT=${OUT:?the device runner sets OUT}
mkdir -p /tmp/checks
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; free -g; nproc; } > "$OUT/env.txt" 2>&1
timeout 240 python3 -m pytest -q -m gpu tests/slide_kernels tests/executor tests/slide -p no:cacheprovider \
  > /tmp/checks/gpu_tests.txt 2>&1
tail -6 /tmp/checks/gpu_tests.txt
stamp gpu-tests
mkdir -p /tmp/nvme-probe
timeout 100 python3 -m bench.speed.host_curves --machine h200-16c-128g --nvme-dir /tmp/nvme-probe \
  --out "$OUT/host_curves.jsonl" > /tmp/checks/host_curves.txt 2>&1
tail -30 /tmp/checks/host_curves.txt
stamp host-curves
rm -rf ~/.cache/slide/machines
timeout 150 python3 -m bench.speed.shape_grid --group cold --out /tmp/grid --budget-s 140 > /tmp/checks/cold.txt 2>&1
tail -4 /tmp/checks/cold.txt
cp /tmp/grid/*.jsonl "$OUT/" 2>/dev/null
stamp cold
tar czf "$OUT/logs.tgz" -C /tmp checks grid 2>/dev/null
