#!/usr/bin/env bash
# Issue 17 on the H200's host (one device call, under 5 minutes; the GPU is not used): our host
# AdamW kernel against DeepSpeed's CPUAdam, the kernel the SlideFormer paper uses.
#   1. `python3 -m bench.host.host_adam`: our kernel against the torch path, FP32 and BF16 moments,
#      1 and all intra-op threads, with the `y += x` yardstick;
#   2. `python3 -m bench.host.deepspeed_adam`: DeepSpeed's CPU Adam op JIT-built from the carried
#      sdist (its C++ only: nothing installed, no internet needed; g++ and ninja as for our kernel)
#      and timed on the same buffers as ours, in the same row format.
# The host's description (lscpu, memory, versions) goes to env.txt; everything is bundled into
# $OUT/all.tgz at the end.
#   run: bash bench/device/h200_cpu_adam.sh   (carry .whl: simpy and DeepSpeed's sdist, fetched
#   once with `python3 -m pip download --no-deps --no-binary=:all: -d .whl deepspeed==0.19.8`;
#   writes into $OUT)
set -uo pipefail
source bench/device/h200_env.sh
ls .whl/deepspeed-*.tar.gz 2>/dev/null || echo "DeepSpeed sdist not carried: step 2 will say so and stop"
{
  lscpu
  free -g
  echo "cpus $(nproc)"
  python3 -c "import torch; print('torch', torch.__version__, 'threads', torch.get_num_threads())"
  g++ --version | head -1
  git log -1 --oneline 2>/dev/null
} > "$OUT/env.txt" 2>&1
grep -E "Model name|^CPU\(s\)|L3|NUMA node\(s\)|cpus|torch" "$OUT/env.txt"
stamp start

timeout 120 python3 -m bench.host.host_adam > "$OUT/host_adam.txt" 2>&1
echo "rc=$?" >> "$OUT/host_adam.txt"
cat "$OUT/host_adam.txt"
stamp host-adam

# the first call builds DeepSpeed's op (two files, ~1 min on 2 cores; less here)
timeout 160 python3 -m bench.host.deepspeed_adam > "$OUT/deepspeed_adam.txt" 2>&1
echo "rc=$?" >> "$OUT/deepspeed_adam.txt"
grep -v "^W[0-9]" "$OUT/deepspeed_adam.txt"
stamp deepspeed-adam
tar czf /tmp/all.tgz -C "$OUT" . && mv /tmp/all.tgz "$OUT/all.tgz"
