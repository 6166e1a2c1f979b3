# Sourced by the device scripts: `tokens N [VOCAB]` writes N random token ids below VOCAB
# (default 128000, under every llama-3 vocabulary) to /tmp/tok.npy; `kept_run MODEL KEEP STEPS TIMEOUT` trains MODEL batch 16 seq 1024 with its
# defaults and `--keep-activations KEEP`, sampling the GPU's memory (nvidia-smi, 0.5 s) beside
# it (RUN_NAME names its files, default MODEL-keep-KEEP), then plans and simulates the same run on the cached `--machine auto` profile; `bundle`
# packs $OUT into $OUT/all.tgz and leaves only that (the device returns at most 8 files).
bundle() { tar czf /tmp/all.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/all.tgz "$OUT/all.tgz"; }
tokens() {
  python3 -c "import numpy as np, sys; np.save('/tmp/tok.npy', np.random.default_rng(0).integers(0, int(sys.argv[2]), int(sys.argv[1])))" "$1" "${2:-128000}"
}
kept_run() {  # MODEL KEEP STEPS TIMEOUT
  local model=$1 keep=$2 steps=$3 limit=$4 name="${RUN_NAME:-$1-keep-$2}"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$OUT/$name-smi.txt" 2>&1 &
  local smi=$!
  timeout -k 20 -s INT "$limit" python3 -m slide.cli train --model "$model" --batch 16 --seq 1024 \
    --keep-activations "$keep" --data /tmp/tok.npy --steps "$steps" --no-progress --log-every 2 \
    --metrics "$OUT/$name.jsonl" > "$OUT/$name.json" 2> "$OUT/$name.err"
  echo "rc=$?" >> "$OUT/$name.err"
  kill "$smi" 2>/dev/null
  timeout 30 python3 -m slide.cli simulate --machine auto --model "$model" --batch 16 --seq 1024 \
    --keep-activations "$keep" > "$OUT/$name-sim.txt" 2>&1
  timeout 30 python3 -m slide.cli plan --machine auto --model "$model" --batch 16 --seq 1024 \
    --keep-activations "$keep" > "$OUT/$name-plan.txt" 2>&1
  python3 - "$OUT" "$name" <<'PY'
import json, sys
out, name = sys.argv[1], sys.argv[2]
text = open(f"{out}/{name}.json").read()
s = json.loads(text[text.index("{"):]) if "{" in text else {}
rows = [json.loads(l) for l in open(f"{out}/{name}.jsonl") if "gpu_reserved_bytes" in l]
smi = [int(x) for x in open(f"{out}/{name}-smi.txt").read().split() if x.isdigit()]
plan = open(f"{out}/{name}-plan.txt").read().splitlines()
print(f"{name}: {s.get('tokens_per_s', 0):,.0f} tok/s measured; steps {s.get('steps_done')}; "
      f"reserved max {max((r['gpu_reserved_bytes'] for r in rows), default=0) / 1e9:.1f} GB; "
      f"allocated max {max((r['gpu_allocated_bytes'] for r in rows), default=0) / 1e9:.1f} GB; "
      f"nvidia-smi max {max(smi, default=0) / 1024:.1f} GiB")
print(f"  summary: placement {s.get('placement')}; predicted {s.get('predicted_tokens_per_s')} tok/s; "
      f"step_time_error {s.get('step_time_error')}; replan {s.get('replan', {}).get('reason')}; "
      f"alloc retries {[r.get('gpu_alloc_retries') for r in rows]}")
print("  " + " | ".join(l.strip() for l in plan[1:5] if l.strip()))
print("  " + next((l.strip() for l in plan if l.startswith("GPU")), "no GPU line"))
PY
  grep -h "step time\|throughput" "$OUT/$name-sim.txt" | head -3
  tail -2 "$OUT/$name.err"
  stamp "$name"
}
