#!/usr/bin/env bash
# One device call: PyTorch FSDP2 + CPUOffloadPolicy on llama-3.2-3b at batch 16, and the largest
# catalog model the planner fits on this host (qwen3-8b) for a few steps.
#   bash bench/device/h200_baselines.sh "$OUT"      (carry .whl)
set -uo pipefail
out=${1:?output directory}
source bench/device/h200_env.sh
timeout 260 python3 -m bench.speed.fsdp_offload --model llama-3.2-3b --batch 16 --out "$out/fsdp2.jsonl" 2>&1 | grep -v "^INFO" | tail -3
stamp fsdp2
timeout 200 python3 -m bench.speed.train_throughput --model qwen3-8b --batch 16 --steps 3 \
  --variants streamed=auto+activations=gpu --traces "$out/traces" --out "$out/qwen3.jsonl" 2>&1 | grep -v "^INFO" | cut -c1-400
stamp qwen3-8b
dmesg 2>/dev/null | grep -i -E "killed process|out of memory" | tail -3
tar czf "$out/traces.tgz" -C "$out" traces 2>/dev/null && rm -rf "$out/traces"
