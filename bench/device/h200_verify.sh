#!/usr/bin/env bash
# What session 7 built after its device time ran out, on the H200 in one call (under 9 minutes;
# everything bundled into $OUT/all.tgz):
#   1. the GPU tests (`pytest -m gpu tests/executor tests/kernels`): the CUDA events reused across
#      repetitions, the checkpoint written a unit at a time, re-planning's engine swap;
#   2. bench/device/h200_startup.sh: llama-3.1-8b batch 16, 5 steps, fresh then cached (issue 17's
#      start-up table; the re-plan decision is in each run's summary);
#   3. a 300-step llama-3.2-3b defaults soak: host RSS every 10 steps (issue 14: flat after the
#      first repetition now that completions and events are reused?).
#   bash bench/device/h200_verify.sh        (carry .whl: simpy; $OUT set)
source bench/device/h200_env.sh
bundle() { tar czf /tmp/all.tgz -C "$OUT" . && mv /tmp/all.tgz "$OUT/all.tgz"; }
stamp start
timeout 150 python3 -m pytest -q -m gpu tests/executor tests/kernels -p no:cacheprovider \
  > "$OUT/gpu_tests.txt" 2>&1; echo "rc=$?" >> "$OUT/gpu_tests.txt"
tail -3 "$OUT/gpu_tests.txt"
stamp gpu-tests
mkdir -p "$OUT/startup"
OUT="$OUT/startup" timeout 200 bash bench/device/h200_startup.sh > "$OUT/startup.txt" 2>&1
tail -30 "$OUT/startup.txt"
stamp startup
python3 -c "import numpy as np; np.save('/tmp/tok.npy', np.random.default_rng(0).integers(0, 128000, 6_000_000))"
timeout -k 30 -s INT 230 python3 -m slide.cli train --model llama-3.2-3b --data /tmp/tok.npy --batch 16 \
  --seq 1024 --steps 300 --no-progress --metrics "$OUT/soak3b.jsonl" --log-every 10 \
  > "$OUT/soak3b.json" 2> "$OUT/soak3b.err"
echo "rc=$?" >> "$OUT/soak3b.err"
python3 - "$OUT/soak3b.jsonl" <<'PY'
import json, sys
import numpy as np
rows = [json.loads(l) for l in open(sys.argv[1]) if '"host_rss_bytes"' in l]
x = np.array([r["step"] for r in rows], float); y = np.array([r["host_rss_bytes"] for r in rows], float)
m = x >= 80
if m.sum() > 3:
    p, c = np.polyfit(x[m], y[m], 1, cov=True)
    print(f"soak3b: {int(x[-1])} steps, RSS {y[m][0]/1e6:.1f} -> {y[-1]/1e6:.1f} MB from step 80, slope {p[0]:.0f} +- {c[0,0]**.5:.0f} B/step")
PY
stamp soak
bundle
