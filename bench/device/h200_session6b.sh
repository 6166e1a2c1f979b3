#!/usr/bin/env bash
# Session 6, call B (H200): a 400-step soak of llama-3.2-3b, batch 16, seq 1024, the defaults, as
# a user runs it; the metrics file has each step's time and, every 10 steps, host RSS and GPU
# memory allocated/reserved (bench/memory/soak_plot.py turns it into the figures).
source bench/device/h200_env.sh
python3 -c "import numpy as np; np.save('/tmp/tok.npy', np.random.default_rng(0).integers(0, 128000, 8_000_000))"
stamp start
timeout 150 python3 -m pytest -q -m gpu tests/executor/test_gpu.py -k "allocation or repeated" -s \
  -p no:cacheprovider > "$OUT/gpu_tests.txt" 2>&1; echo "rc=$?" >> "$OUT/gpu_tests.txt"
stamp gpu-tests
timeout 480 python3 -m slide.cli train --model llama-3.2-3b --data /tmp/tok.npy --batch 16 \
  --seq 1024 --steps 400 --no-progress --metrics "$OUT/soak3b.jsonl" --log-every 10 \
  > "$OUT/soak3b.json" 2> "$OUT/soak3b.err"
echo "rc=$?" >> "$OUT/soak3b.err"
stamp done
