#!/usr/bin/env bash
# Session 7, call B (H200, under 9 minutes; bundled into $OUT/all.tgz): issue 14's soaks after the
# loss history moved into a ring allocated once:
#   1. llama-3.2-3b batch 16 seq 1024 with the defaults, `slide train` as a user runs it, 450
#      steps asked for, stopped by SIGINT at 400 s if not done (it finishes the step in flight):
#      host RSS and GPU memory every 10 steps (bench/memory/soak_plot.py plots them);
#   2. tiny-llama, every unit sliding, 3,000 steps on the GPU: host RSS every 100 steps.
source bench/device/h200_env.sh
python3 -c "import numpy as np; np.save('/tmp/tok.npy', np.random.default_rng(0).integers(0, 128000, 8_000_000))"
python3 -c "import numpy as np; np.save('/tmp/tiny.npy', np.random.default_rng(0).integers(0, 500, 4_000_000))"
bundle() { tar czf /tmp/all.tgz -C "$OUT" . && mv /tmp/all.tgz "$OUT/all.tgz"; }
stamp start
timeout -k 30 -s INT 400 python3 -m slide.cli train --model llama-3.2-3b --data /tmp/tok.npy --batch 16 \
  --seq 1024 --steps 450 --no-progress --metrics "$OUT/soak3b.jsonl" --log-every 10 \
  > "$OUT/soak3b.json" 2> "$OUT/soak3b.err"
echo "rc=$?" >> "$OUT/soak3b.err"
tail -3 "$OUT/soak3b.err"
stamp soak3b
timeout 90 python3 -m slide.cli train --model tiny-llama --placement small --data /tmp/tiny.npy \
  --batch 4 --seq 256 --steps 3000 --no-progress --metrics "$OUT/soak_tiny.jsonl" --log-every 100 \
  > "$OUT/soak_tiny.json" 2> "$OUT/soak_tiny.err"
echo "rc=$?" >> "$OUT/soak_tiny.err"
stamp tiny
python3 - "$OUT" <<'PY'
import json, sys
import numpy as np
for name, lo in (("soak3b", 40), ("soak_tiny", 200)):
    try:
        rows = [json.loads(l) for l in open(f"{sys.argv[1]}/{name}.jsonl") if '"host_rss_bytes"' in l]
    except OSError as e:
        print(name, e); continue
    x = np.array([r["step"] for r in rows], float); y = np.array([r["host_rss_bytes"] for r in rows], float)
    m = x >= lo
    if m.sum() > 3:
        p, c = np.polyfit(x[m], y[m], 1, cov=True)
        print(f"{name}: {int(x[-1])} steps, RSS {y[m][0]/1e6:.1f} -> {y[-1]/1e6:.1f} MB, slope {p[0]:.0f} +- {c[0,0]**.5:.0f} B/step")
PY
bundle
