#!/usr/bin/env bash
# Session 12's third device call (under 9 minutes):
#   1. the GPU test that completions create their CUDA events up front, and the allocation test;
#   2. issue 14: a llama-3.2-1b soak whose last pass (358 = 6 + 5 x 64 + 32 steps: a 32-step
#      graph from step 327) now runs on events created before the steady state (the 3B soak's
#      1.3 MB rise at its last pass, call 1);
#   3. issue 18: `--activations nvme` with `--out`, so the peak RSS holds the final save the
#      ledger counts (4.73 GB), with calibrate's profile from the same lease.
#   carry [".clean"]; command: cd .clean && bash bench/device/h200_session12c.sh
source bench/device/h200_env.sh
timeout 150 python3 -m pytest -q -m gpu tests/executor/test_gpu.py -k "events or allocation" -p no:cacheprovider \
  > "$OUT/gpu-tests.txt" 2>&1; echo "rc=$?" >> "$OUT/gpu-tests.txt"; tail -2 "$OUT/gpu-tests.txt"
NO_BUNDLE=1 SOAK_MODEL=llama-3.2-1b SOAK_STEPS=358 SOAK_LIMIT=200 SOAK_SKIPS="100 200" \
  bash bench/device/h200_soak_long.sh
rm -rf /tmp/slide-run
ACTIVATIONS_LIMIT=240 TRAIN_OUT=/tmp/slide-run RUNS=activations STEPS=3 bash bench/device/h200_nvme.sh
