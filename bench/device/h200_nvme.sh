#!/usr/bin/env bash
# Issue 18 on the H200 (one device call, under 9 minutes): the NVMe tier with direct I/O.
#   1. `slide calibrate --nvme-dir /tmp/nvme`: the disk's O_DIRECT read/write rates in a profile;
#   2. `slide train` llama-3.2-3b batch 16 seq 1024 --optimizer nvme --nvme-dir /tmp/nvme, every
#      unit sliding, 3 steps (~45-65 s each predicted, plus writing and reading back the state),
#      per-step metrics, peak RSS (/usr/bin/time -v) and the page cache (/proc/meminfo Cached)
#      sampled every 2 s while it runs;
#   3. `slide simulate` of the same run on the calibrated profile (predicted step time).
# The drive files are O_DIRECT (executor/nvme_io.py); kvikio is used instead when its wheels are
# carried in .whl (kvikio-cu13, libkvikio-cu13, rapids-logger; the image has cupy and cufile; the
# backend shows in train.err's "nvme:" line). Everything is bundled into $OUT/all.tgz at the end
# (the device returns at most 8 files).
#   run: bash bench/device/h200_nvme.sh        (carry .whl: simpy; writes into $OUT)
set -uo pipefail
source bench/device/h200_env.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*kvikio*.whl .whl/rapids_logger*.whl 2>/dev/null || echo "kvikio wheels not carried: O_DIRECT backend"
rm -rf /tmp/nvme && mkdir -p /tmp/nvme
df -B1 /tmp/nvme | tee "$OUT/df.txt"
stat -f /tmp/nvme | tee -a "$OUT/df.txt"
python3 -c "import numpy as np; np.save('/tmp/tok.npy', np.random.default_rng(0).integers(0, 128000, 4_000_000))"
stamp start

timeout 120 python3 -m slide.cli calibrate --nvme-dir /tmp/nvme --out "$OUT/cal.toml" > "$OUT/calibrate.txt" 2>&1
echo "rc=$?" >> "$OUT/calibrate.txt"
grep -iE "nvme|read|write" "$OUT/cal.toml" | head -8
stamp calibrate
machine="$OUT/cal.toml"
[ -f "$machine" ] || machine=h200-16c-128g

# --resident 0 --streamed 0: on the H200 the placement search keeps all of a 3B model on the GPU
# and the NVMe files would stay empty; every unit sliding puts its 38.6 GB of state on the disk
flags=(--model llama-3.2-3b --machine "$machine" --batch 16 --seq 1024 --steps "${STEPS:-3}" --optimizer nvme
       --resident 0 --streamed 0 --nvme-dir /tmp/nvme)
python3 -m slide.cli plan "${flags[@]}" > "$OUT/plan.txt" 2>&1
head -30 "$OUT/plan.txt"

# the page cache while the run goes (the state must not be in it) and the files' sizes
( while sleep 2; do echo "$(date +%s) $(grep -E '^Cached:' /proc/meminfo | awk '{print $2}') kB cached, files $(du -sb /tmp/nvme | cut -f1) B, slide RSS $(ps -C python3 -o rss= | sort -n | tail -1) kB"; done ) > "$OUT/meminfo.txt" 2>&1 &
sampler=$!
timer=()
[ -x /usr/bin/time ] && timer=(/usr/bin/time -v)
timeout 320 ${timer[@]+"${timer[@]}"} python3 -m slide.cli -v train "${flags[@]}" --data /tmp/tok.npy --no-progress \
  --log-every 1 --metrics "$OUT/train.jsonl" --save-trace "$OUT/measured.json" > "$OUT/train.json" 2> "$OUT/train.err"
echo "rc=$?" >> "$OUT/train.err"
kill "$sampler" 2>/dev/null
grep -E "nvme:|Maximum resident|Elapsed|rc=|[Ee]rror" "$OUT/train.err" | grep -v "^INFO.*op " | tail -12
[ -x /usr/bin/time ] || echo "/usr/bin/time missing: RSS only from train.jsonl's host_rss_bytes"
tail -3 "$OUT/meminfo.txt"
ls -la /tmp/nvme  # empty: the run removes its files
stamp train

timeout 40 python3 -m slide.cli simulate "${flags[@]}" --save-trace "$OUT/predicted.json" > "$OUT/simulate.txt" 2>&1
echo "rc=$?" >> "$OUT/simulate.txt"
grep -E "step time|bottleneck|peak memory|utilisation" "$OUT/simulate.txt"
stamp done
tar czf /tmp/all.tgz -C "$OUT" . && mv /tmp/all.tgz "$OUT/all.tgz"
