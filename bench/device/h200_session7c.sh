#!/usr/bin/env bash
# Session 7, call C (H200, under 5 minutes; bundled into $OUT/all.tgz): llama-3.1-8b batch 16 seq
# 1024 with the defaults (`--machine auto`, the placement search), as a user runs it, 6 steps,
# with its measured trace and metrics, to see where its step time departs from the prediction.
source bench/device/h200_env.sh
python3 -c "import numpy as np; np.save('/tmp/tok.npy', np.random.default_rng(0).integers(0, 128000, 2_000_000))"
bundle() { tar czf /tmp/all.tgz -C "$OUT" . && mv /tmp/all.tgz "$OUT/all.tgz"; }
stamp start
timeout -k 20 -s INT 250 python3 -m slide.cli -v train --model llama-3.1-8b --batch 16 --seq 1024 \
  --data /tmp/tok.npy --steps 6 --no-progress --metrics "$OUT/8b.jsonl" --log-every 1 \
  --save-trace "$OUT/8b-measured.json" > "$OUT/8b.json" 2> "$OUT/8b.err"
echo "rc=$?" >> "$OUT/8b.err"
grep -v " op " "$OUT/8b.err" | tail -25
stamp 8b
profile=$(ls ~/.cache/slide/machines/*.toml | head -1)
cp "$profile" "$OUT/auto.toml"
bundle
