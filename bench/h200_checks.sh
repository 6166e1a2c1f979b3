#!/usr/bin/env bash
# One device call: the GPU tests (kernels + executor), the kernel benchmark with liger in the same
# run and the RMSNorm backward sweep, and the 1B-class BF16 parity run (50 steps).
#   bash bench/h200_checks.sh "$OUT"      (carry .whl: simpy and liger wheels)
set -uo pipefail
out=${1:?output directory}
source bench/h200_env.sh
timeout 170 python3 -m pytest -q -m gpu tests/kernels tests/executor -p no:cacheprovider 2>&1 | tail -4
stamp tests
timeout 250 python3 -m bench.kernels --out "$out/kernels" --sweep rms_norm 2>&1 | tail -12
stamp kernels
timeout 160 python3 -m bench.gpu_parity --out "$out/parity.json" 2>&1 | grep -v "^INFO" | tail -4
stamp parity
