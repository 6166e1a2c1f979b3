#!/usr/bin/env bash
# One device call: the GPU tests (kernels + executor), the kernel benchmark with liger in the same
# run, one decoder layer's measured memory against the ledger's model, and llama-3.2-3b batch 16
# pure over 8 steps (its host-bound step varies from step to step).
#   bash bench/device/h200_checks.sh "$OUT" [calibrated.toml]    (carry .whl: simpy and liger wheels)
set -uo pipefail
out=${1:?output directory}
machine=${2:-bench/data/h200-calibrated.toml}
source bench/device/h200_env.sh
timeout 170 python3 -m pytest -q -m gpu tests/slide_kernels tests/executor -p no:cacheprovider 2>&1 | tail -4
stamp tests
timeout 40 python3 -m bench.memory.layer_memory 2>&1 | tee "$out/layer_memory.md" | grep -v Warn
stamp layer-memory
timeout 250 python3 -m bench.kernels.speed --out "$out/kernels" 2>&1 | tail -45
stamp kernels
timeout 80 python3 -m bench.speed.train_throughput --machine "$machine" --traces "$out/traces" \
  --out "$out/throughput.jsonl" --model llama-3.2-3b --batch 16 --variants pure --steps 8 \
  2>&1 | grep -v "^INFO" | cut -c1-300
stamp 3b-b16-pure-8-steps
tar czf "$out/traces.tgz" -C "$out" traces && rm -rf "$out/traces"
