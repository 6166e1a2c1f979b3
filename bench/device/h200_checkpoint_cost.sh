#!/usr/bin/env bash
# The cost of a checkpoint on the H200, on the user's path (one device call): the executor's GPU
# tests, the disk's write bandwidth (bench/host/disk_write.py, 8 GiB then fsync), then
# `slide train --save-every 5 --keep 1` on llama-3.2-1b batch 16 (12 steps: the steps after each
# save against the steady ones) and llama-3.2-3b (7 steps: a 38.5 GB checkpoint; the final save
# needs a second one on the 64 GiB disk and must fail in one line, the step-5 checkpoint kept).
#   carry [".clean"]; command: cd .clean && bash bench/device/h200_checkpoint_cost.sh
source bench/device/h200_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt"
{ df -h / /tmp; free -g; nproc; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } > "$OUT/host.txt" 2>&1
stamp start
timeout 240 python3 -m pytest -q -m gpu tests/executor -p no:cacheprovider > "$OUT/gpu_tests.txt" 2>&1; echo "rc=$?" >> "$OUT/gpu_tests.txt"
stamp gpu-tests
python3 bench/host/disk_write.py --dir /tmp --gib 8 > "$OUT/disk.json" 2>&1
stamp disk
python3 -c "import numpy as np; np.save('/tmp/tok.npy', np.random.default_rng(0).integers(0, 128000, 3_000_000))"
run() {  # name, then slide train arguments
  local name=$1; shift
  /usr/bin/time -v python3 -m slide.cli train --data /tmp/tok.npy --seq 1024 --no-progress \
    --metrics "$OUT/$name.jsonl" "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"
  echo "rc=$?" >> "$OUT/$name.err"
  du -sb /tmp/ck-"$name"/checkpoints/* >> "$OUT/$name.err" 2>&1
  stamp "$name"
}
run save1b --model llama-3.2-1b --batch 16 --steps 12 --save-every 5 --keep 1 --out /tmp/ck-save1b
rm -rf /tmp/ck-save1b
# 3B: one checkpoint is 38.5 GB; the final save needs a second on this 64 GiB disk: it should
# fail with one line (disk full), the step-5 checkpoint kept
run save3b --model llama-3.2-3b --batch 16 --steps 7 --save-every 5 --keep 1 --out /tmp/ck-save3b
ls -la /tmp/ck-save3b /tmp/ck-save3b/checkpoints >> "$OUT/save3b.err" 2>&1
rm -rf /tmp/ck-save3b
stamp done
