#!/usr/bin/env bash
# Kept tapes (`--keep-activations`: the top layers' forwards keep their autograd tapes, no
# recompute) on the H200, in one call (about 8 minutes; everything bundled into $OUT/all.tgz):
#   1. the GPU tests (bf16 parity of kept tapes against plain PyTorch, the rest unchanged);
#   2. llama-3.1-8b and llama-3.2-3b, batch 16 x seq 1024, defaults (the search picks K) against
#      --keep-activations 0: tokens/s against the prediction, and the GPU's peak memory against
#      the ledger (torch's caching allocator holds the tapes: fragmentation is the risk).
#   bash bench/device/h200_kept_tapes.sh        (carry .whl: simpy; $OUT set)
source bench/device/h200_env.sh
bundle() { tar czf /tmp/all.tgz -C "$OUT" . && mv /tmp/all.tgz "$OUT/all.tgz"; }
stamp start
timeout 150 python3 -m pytest -q -m gpu tests/executor -p no:cacheprovider \
  > "$OUT/gpu_tests.txt" 2>&1; echo "rc=$?" >> "$OUT/gpu_tests.txt"
tail -3 "$OUT/gpu_tests.txt"
stamp gpu-tests
python3 -c "import numpy as np; np.save('/tmp/tok.npy', np.random.default_rng(0).integers(0, 128000, 6_000_000))"
for model in llama-3.1-8b llama-3.2-3b; do
  for keep in auto 0; do
    name="$model-keep-$keep"
    python3 -m slide.cli plan --model "$model" --machine h200-16c-128g --batch 16 --seq 1024 \
      --keep-activations "$keep" > "$OUT/$name-plan.txt" 2>&1
    head -3 "$OUT/$name-plan.txt"
    timeout -k 30 -s INT 110 python3 -m slide.cli train --model "$model" --machine h200-16c-128g \
      --batch 16 --seq 1024 --keep-activations "$keep" --data /tmp/tok.npy --steps 12 \
      --no-progress --metrics "$OUT/$name.jsonl" > "$OUT/$name.json" 2> "$OUT/$name.err"
    echo "rc=$?" >> "$OUT/$name.err"
    tail -2 "$OUT/$name.err"
    stamp "$name"
  done
done
bundle
