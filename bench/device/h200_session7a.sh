#!/usr/bin/env bash
# Session 7, call A (H200, under 9 minutes), everything bundled into $OUT/all.tgz:
#   1. the GPU tests (`pytest -m gpu tests/executor tests/kernels`: the CUDA trace-obeys-graph
#      check among them);
#   2. issue 14: a GPU soak of tiny-llama with every unit sliding (`--placement small`), 4,000
#      steps: host RSS every 100 steps, to see whether the per-step host growth seen on the 3B
#      soak comes from the per-op machinery (events, completions, spans), which a tiny model runs
#      as often as a big one;
#   3. issue 17: pure sliding llama-3.2-3b batch 16 seq 1024 (`--placement small`) with
#      `--machine auto` (the floor: 10,300 tokens/s), and its prediction on the same profile;
#   4. issue 17: bench/host/host_adam.py (the single-pass host AdamW against torch's fused path).
source bench/device/h200_env.sh
python3 -c "import numpy as np; np.save('/tmp/tok.npy', np.random.default_rng(0).integers(0, 128000, 4_000_000))"
python3 -c "import numpy as np; np.save('/tmp/tiny.npy', np.random.default_rng(0).integers(0, 500, 4_000_000))"
bundle() { tar czf /tmp/all.tgz -C "$OUT" . && mv /tmp/all.tgz "$OUT/all.tgz"; }
stamp start

timeout 200 python3 -m pytest -q -m gpu tests/executor tests/kernels -p no:cacheprovider -x \
  > "$OUT/gpu_tests.txt" 2>&1; echo "rc=$?" >> "$OUT/gpu_tests.txt"
tail -3 "$OUT/gpu_tests.txt"
stamp gpu-tests

timeout 120 python3 -m slide.cli train --model tiny-llama --placement small --data /tmp/tiny.npy \
  --batch 4 --seq 256 --steps 4000 --no-progress --metrics "$OUT/soak_tiny.jsonl" --log-every 100 \
  > "$OUT/soak_tiny.json" 2> "$OUT/soak_tiny.err"
echo "rc=$?" >> "$OUT/soak_tiny.err"
python3 - "$OUT/soak_tiny.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"host_rss_bytes"' in l]
xs = [(r["step"], r["host_rss_bytes"]) for r in rows]
print("tiny soak rss samples:", len(xs), "first", xs[:2], "last", xs[-2:])
PY
stamp tiny-soak

shape=(--model llama-3.2-3b --batch 16 --seq 1024 --placement small)
timeout 150 python3 -m slide.cli -v train "${shape[@]}" --machine auto --data /tmp/tok.npy --steps 12 \
  --no-progress --metrics "$OUT/sliding3b.jsonl" --save-trace "$OUT/sliding3b-measured.json" \
  > "$OUT/sliding3b.json" 2> "$OUT/sliding3b.err"
echo "rc=$?" >> "$OUT/sliding3b.err"
profile=$(ls ~/.cache/slide/machines/*.toml | head -1)
cp "$profile" "$OUT/auto.toml"
python3 -m slide.cli simulate "${shape[@]}" --machine "$profile" --save-trace "$OUT/sliding3b-predicted.json" \
  > "$OUT/sliding3b-simulate.txt" 2>&1
python3 -m slide.cli compare-trace "$OUT/sliding3b-predicted.json" "$OUT/sliding3b-measured.json" \
  > "$OUT/sliding3b-compare.txt" 2>&1
grep -E "tokens_per_s|step_time" "$OUT/sliding3b-compare.txt"; tail -2 "$OUT/sliding3b.json"
stamp sliding3b

timeout 150 python3 -m bench.host.host_adam > "$OUT/host_adam.txt" 2>&1; echo "rc=$?" >> "$OUT/host_adam.txt"
cat "$OUT/host_adam.txt"
stamp host-adam
bundle
