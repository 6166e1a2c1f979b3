#!/usr/bin/env bash
# Session 9, device call 3 (under 9.5 minutes): issue 14's soak, llama-3.2-3b batch 16 seq 1024
# with the defaults and `--keep-activations ${KEEP:-auto}`, 420 steps (stopped by SIGINT at
# 370 s if slower): host RSS, GPU allocated and reserved every 10 steps, step time per step;
# bench/memory/soak_plot.py fits the slopes. Then, in what time is left, issue 18's NVMe run
# (bench/device/h200_nvme.sh, 2 steps) for its peak RSS against the ledger.
#   bash bench/device/h200_session9c.sh        (carry .whl: simpy, kvikio; $OUT set)
source bench/device/h200_env.sh
source bench/device/h200_kept_runs.sh
stamp start
tokens 8000000
timeout -k 30 -s INT 370 python3 -m slide.cli train --model llama-3.2-3b --data /tmp/tok.npy --batch 16 \
  --seq 1024 --steps 420 --keep-activations "${KEEP:-auto}" --no-progress --metrics "$OUT/soak3b.jsonl" \
  --log-every 10 > "$OUT/soak3b.json" 2> "$OUT/soak3b.err"
echo "rc=$?" >> "$OUT/soak3b.err"
tail -2 "$OUT/soak3b.err"
python3 bench/memory/soak_plot.py "$OUT/soak3b.jsonl" --out "$OUT/soak3b.png" 2>&1 | tee "$OUT/soak3b-fit.txt"
stamp soak
mkdir -p "$OUT/nvme"
OUT="$OUT/nvme" STEPS=2 timeout 150 bash bench/device/h200_nvme.sh > "$OUT/nvme.txt" 2>&1
tail -20 "$OUT/nvme.txt"
rm -f "$OUT/nvme/all.tgz"
stamp nvme
bundle
