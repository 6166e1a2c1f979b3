#!/usr/bin/env bash
# The fine-tuning recipe on the H200, one lease: (1) global-norm clipping against per-unit on the
# default path (llama-3.2-3b and llama-3.1-8b, batch 16 seq 1024, 10 steps); (2) a 300-step chat
# SFT of llama-3.2-1b (random init) on bench/chat/make_sft.py's data, --packing documents,
# --clip global, an eval every 25 steps, TensorBoard; (3) the largest model of the box: llama-3.1-8b
# depth-scaled to LAYERS layers with BF16 moments, 5 steps, peak RSS against the ledger;
# (4) qwen2.5-14b batch 16 with the default layout and with --host-weights cast.
#   bash bench/device/h200_recipe.sh    (repo root; carry .whl; $OUT set)
set -uo pipefail
source bench/device/h200_env.sh
OUT=${OUT:?the device runner sets OUT}
python3 -c "import numpy as np; np.save('/tmp/tok.npy', np.random.default_rng(0).integers(0, 128000, 4_000_000))"
# the runner brings back only a few files a call: each part writes under /tmp/recipe, tarred at the end
R=/tmp/recipe
mkdir -p "$R/clip" "$R/chat" "$R/capacity"
trap 'tar czf "$OUT/recipe.tgz" -C "$R" .' EXIT
summary() {  # label, summary JSON file
  python3 -c "import json,sys; t=open(sys.argv[1]).read(); s=json.loads(t[t.index('{'):]); print(sys.argv[2], round(s['tokens_per_s']), s.get('predicted_tokens_per_s'), s.get('step_time_error'), s['placement'], s.get('eval_loss'))" "$2" "$1" || tail -3 "${2%.json}.err"
}
peak() {  # command...: run it; its peak host RSS (the largest descendant's) and GPU memory used
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > /tmp/gpu_mem.txt &
  local smi=$!
  python3 -c "import resource,subprocess,sys; r=subprocess.call(sys.argv[1:]); print(f'peak_rss_gib {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20:.2f}', file=sys.stderr); sys.exit(r)" "$@"
  kill $smi; echo "peak_gpu_used_gib $(sort -n /tmp/gpu_mem.txt | tail -1 | awk '{printf "%.2f", $1/1024}')" >&2
}
for model in ${CLIP_MODELS:-llama-3.2-3b llama-3.1-8b}; do
  for mode in per-unit global; do
    label="$model-$mode"
    timeout 150 python3 -m slide.cli train --data /tmp/tok.npy --model "$model" --batch 16 --seq 1024 \
      --steps 10 --no-progress --clip "$mode" --save-trace "/tmp/$label.trace.json" \
      > "$R/clip/$label.json" 2> "$R/clip/$label.err"
    summary "$label" "$R/clip/$label.json"; stamp "$label"
  done
done
mv /tmp/*.trace.json "$R/clip/"
python3 -m bench.chat.make_sft /tmp/sft
timeout 200 python3 -m slide.cli train --model llama-3.2-1b --data /tmp/sft/train.jsonl \
  --tokenizer /tmp/sft/tokenizer --eval-data /tmp/sft/eval.jsonl --eval-every 25 --eval-batches 4 \
  --packing documents --clip global --steps 300 --batch 8 --seq 256 --lr 3e-4 --warmup-steps 20 \
  --tensorboard "$R/chat/tb" --metrics "$R/chat/metrics.jsonl" --no-progress \
  > "$R/chat/summary.json" 2> "$R/chat/err.txt"
summary chat "$R/chat/summary.json"; stamp chat
LAYERS=${LAYERS:-90}
python3 - "$LAYERS" <<'PY'
import json, sys
from pathlib import Path
from slide_ir.specs.model_catalog import load_model
cfg = load_model("llama-3.1-8b").to_hf_config()
cfg["num_hidden_layers"] = int(sys.argv[1])
Path("/tmp/big").mkdir(exist_ok=True)
Path("/tmp/big/config.json").write_text(json.dumps(cfg))
PY
python3 -m slide.cli plan --model /tmp/big --moments bf16 --batch 4 --seq 1024 --json > "$R/capacity/plan.json" 2> "$R/capacity/plan.err"
python3 -c "import json; p=json.load(open('$R/capacity/plan.json')); print('ledger feasible', p['feasible'], p['placement']['chosen'], {t: round(m['peak_bytes'] / 2**30, 2) for t, m in p['memory'].items()})" || tail -3 "$R/capacity/plan.err"
df -h /tmp | tail -1
peak timeout 240 python3 -m slide.cli train --model /tmp/big --moments bf16 --batch 4 --seq 1024 \
  --steps 5 --data /tmp/tok.npy --no-progress --no-replan > "$R/capacity/summary.json" 2> "$R/capacity/err.txt"
summary capacity "$R/capacity/summary.json"; grep -E "^peak_" "$R/capacity/err.txt"; du -sh ~/.cache/slide 2>/dev/null; stamp capacity
for hw in auto cast; do
  peak timeout 150 python3 -m slide.cli train --model qwen2.5-14b --batch 16 --seq 1024 --steps 6 \
    --data /tmp/tok.npy --no-progress --no-replan --host-weights $hw > "$R/capacity/14b-$hw.json" 2> "$R/capacity/14b-$hw.err"
  summary "14b-$hw" "$R/capacity/14b-$hw.json"; grep -E "^peak_" "$R/capacity/14b-$hw.err"; stamp "14b-$hw"
done
