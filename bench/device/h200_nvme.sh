#!/usr/bin/env bash
# Issue 18 on the H200 (one device call, under 9 minutes): the NVMe tier with direct I/O.
#   1. `slide calibrate --nvme-dir /tmp/nvme`: the disk's O_DIRECT read/write rates in a profile;
#   2. `slide train` llama-3.2-3b batch 16 seq 1024 --nvme-dir /tmp/nvme, for each run named in
#      $RUNS (default: optimizer): `optimizer` = --optimizer nvme with every unit sliding (38.6 GB
#      of state on the disk), `moments` = --optimizer nvme-moments, every unit sliding (25.7 GB),
#      `activations` = --activations nvme --keep-activations 0 (the layer inputs, 2.8 GB per
#      step; kept tapes would keep them all on the GPU); $STEPS steps each (default 3), per-step
#      metrics, peak RSS (/usr/bin/time -v) and the page cache (/proc/meminfo Cached) sampled
#      every 2 s while it runs;
#   3. `slide simulate` of the same run on the calibrated profile (predicted step time).
# TRAIN_OUT=DIR gives each training `--out DIR`: its final save then runs inside the measured
# peak RSS, as the ledger's final-save term assumes.
# The drive files are O_DIRECT (executor/nvme_io.py); kvikio is used instead when its wheels are
# carried in .whl (kvikio-cu13, libkvikio-cu13, rapids-logger; the image has cupy and cufile; the
# backend shows in each run's .err "nvme:" line). Everything is bundled into $OUT/all.tgz at the
# end (the device returns at most 8 files).
#   run: RUNS="optimizer moments activations" bash bench/device/h200_nvme.sh   (carry .whl; $OUT)
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

nvme_run() {  # TAG LIMIT FLAGS...: one training, its samples, and its prediction
  local tag=$1 limit=$2
  shift 2
  local flags=(--model llama-3.2-3b --machine "$machine" --batch 16 --seq 1024 --steps "${STEPS:-3}"
               --nvme-dir /tmp/nvme "$@")
  python3 -m slide.cli plan "${flags[@]}" > "$OUT/$tag-plan.txt" 2>&1
  head -4 "$OUT/$tag-plan.txt"; grep -A2 "^NVME" "$OUT/$tag-plan.txt"
  # the page cache while the run goes (the state must not be in it) and the files' sizes
  ( while sleep 2; do echo "$(date +%s) $(grep -E '^Cached:' /proc/meminfo | awk '{print $2}') kB cached, files $(du -sb /tmp/nvme | cut -f1) B, slide RSS $(ps -C python3 -o rss= | sort -n | tail -1) kB"; done ) > "$OUT/$tag-meminfo.txt" 2>&1 &
  local sampler=$! timer=()
  [ -x /usr/bin/time ] && timer=(/usr/bin/time -v)
  local save=()
  [ -n "${TRAIN_OUT:-}" ] && save=(--out "$TRAIN_OUT")
  timeout -s INT "$limit" ${timer[@]+"${timer[@]}"} python3 -m slide.cli -v train "${flags[@]}" --data /tmp/tok.npy \
    ${save[@]+"${save[@]}"} --no-progress --log-every 1 --metrics "$OUT/$tag-train.jsonl" --save-trace "$OUT/$tag-measured.json" \
    > "$OUT/$tag-train.json" 2> "$OUT/$tag-train.err"
  echo "rc=$?" >> "$OUT/$tag-train.err"
  kill "$sampler" 2>/dev/null
  grep -E "nvme:|Maximum resident|Elapsed|rc=|[Ee]rror" "$OUT/$tag-train.err" | grep -v "^INFO.*op " | tail -8
  [ -x /usr/bin/time ] || echo "/usr/bin/time missing: RSS only from the metrics' host_rss_bytes"
  tail -2 "$OUT/$tag-meminfo.txt"
  python3 -c "import json,sys; [print(r['step'], round(r['step_time_s'],2), r.get('host_rss_bytes')) for r in map(json.loads, open(sys.argv[1]))]" "$OUT/$tag-train.jsonl"
  grep -E "tokens_per_s|steady|step_time_error" "$OUT/$tag-train.json"
  ls -la /tmp/nvme  # empty: the run removes its files
  timeout 40 python3 -m slide.cli simulate "${flags[@]}" --save-trace "$OUT/$tag-predicted.json" > "$OUT/$tag-simulate.txt" 2>&1
  grep -E "step time|bottleneck|peak memory|utilisation" "$OUT/$tag-simulate.txt"
  stamp "$tag"
}

for run in ${RUNS:-optimizer}; do
  case $run in
    # every unit sliding: on the H200 the placement search keeps all of a 3B model on the GPU
    # and the NVMe files would stay empty
    optimizer) nvme_run optimizer 330 --optimizer nvme --resident 0 --streamed 0 ;;
    moments) nvme_run moments 200 --optimizer nvme-moments --resident 0 --streamed 0 ;;
    activations) nvme_run activations "${ACTIVATIONS_LIMIT:-120}" --activations nvme --keep-activations 0 ;;
    *) echo "unknown run $run (optimizer, moments, activations)"; exit 2 ;;
  esac
done
tar czf /tmp/all.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/all.tgz "$OUT/all.tgz"  # only the bundle: 8 files come back
