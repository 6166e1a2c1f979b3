#!/usr/bin/env bash
# Data-parallel sliding on `nvidia-h200-x2` (2 H200s, 32 host cores): written while only `nvidia-h200` was
# lent, so NOT YET RUN on a GPU (its flags, comparison and trace count ran on CPU with tiny-llama
# and gloo); check its output before trusting a figure. One call, about 9 minutes (a guess):
#   kind nvidia-h200-x2; carry [".clean"]; command: cd .clean && bash bench/device/h200x2_data_parallel.sh
# 1. correctness: llama-3.2-1b, BF16, 20 steps, global batch 16 seq 1024, the same tokens in the
#    same order: --nproc 1 against --nproc 2, per-step losses and final weights compared;
# 2. scaling: llama-3.2-3b and llama-3.1-8b, seq 1024, global batch 32, the defaults and pure
#    sliding (--placement small): tokens/s on 1 and 2 GPUs, GPU peak per rank, host RSS, and
#    `slide simulate` of the same flags;
# 3. the measured Gantt with the `net` lane (--gantt, rank 0's trace).
source bench/device/h200_env.sh
source bench/device/h200_kept_runs.sh
export NCCL_NVLS_ENABLE=0  # NVLink multicast off: on shared hosts it can take the GPUs down
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
tokens 30000000
stamp start

# -- 1. two ranks against one on the same global batch --------------------------------------------
parity="--model llama-3.2-1b --data /tmp/tok.npy --dtype bfloat16 --batch 16 --seq 1024 --steps 20
        --no-shuffle --no-progress"
for n in 1 2; do
  python3 -m slide.cli train $parity --nproc $n --out /tmp/parity$n --metrics "$OUT/parity$n.jsonl" \
    > "$OUT/parity$n.json" 2> "$OUT/parity$n.err"
  echo "parity nproc $n rc=$?"; tail -2 "$OUT/parity$n.err"
done
python3 - <<'PY' | tee "$OUT/parity.txt"
import json
import os
from pathlib import Path
import torch
from safetensors.torch import load_file
from slide.checkpoints import find_checkpoint
rows = [[json.loads(line) for line in open(f"{os.environ['OUT']}/parity{n}.jsonl")] for n in (1, 2)]
losses = [[r["loss"] for r in rs if "loss" in r] for rs in rows]
print("max |loss(2 ranks) - loss(1 rank)|:", max(abs(a - b) for a, b in zip(*losses, strict=True)))
w1, w2 = (load_file(str(find_checkpoint(Path(f"/tmp/parity{n}")) / "model.safetensors")) for n in (1, 2))
err = {k: float((w2[k].float() - w1[k].float()).norm() / w1[k].float().norm()) for k in w1}
worst = max(err, key=err.get)
print(f"weights: worst norm-relative difference {err[worst]:.3e} ({worst}), median "
      f"{sorted(err.values())[len(err) // 2]:.3e}")
PY
stamp parity

# -- 2. scaling: each run's summary has its prediction (predicted_tokens_per_s, step_time_error)
for model in llama-3.2-3b llama-3.1-8b; do
  for placement in "" "--placement small"; do
    tag=$model${placement:+-sliding}
    for n in 1 2; do
      /usr/bin/time -v python3 -m slide.cli train --model $model --batch 32 --seq 1024 --nproc $n \
        $placement --data /tmp/tok.npy --steps 6 --no-progress --metrics "$OUT/run-$tag-$n.jsonl" \
        > "$OUT/run-$tag-$n.json" 2> "$OUT/run-$tag-$n.err"
      echo "== $tag nproc $n rc=$?"
      grep -E "tokens_per_s|step_time_error|placement" "$OUT/run-$tag-$n.json"
      # KiB, of the largest single process (one rank): a host's RSS is the ranks' sum
      grep -E "Maximum resident" "$OUT/run-$tag-$n.err"
      python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; \
print('gpu reserved, rank 0: %.2f GB' % (max(x.get('gpu_reserved_bytes',0) for x in r)/1e9))" \
        "$OUT/run-$tag-$n.jsonl"
    done
  done
  stamp "$model"
done

# -- 3. the net lane in the measured Gantt (3B defaults, 2 ranks) ---------------------------------
python3 -m slide.cli train --model llama-3.2-3b --batch 32 --seq 1024 --nproc 2 --data /tmp/tok.npy \
  --steps 6 --no-progress --trace-steps 3:4 --gantt "$OUT/gantt-net.png" --trace "$OUT/trace-net.json" \
  > "$OUT/gantt-net.json" 2> "$OUT/gantt-net.err"
echo "gantt rc=$?"
python3 - "$OUT/trace-net.json" <<'PY'
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
lanes = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
spans = [e for e in events if e.get("ph") == "X"]
print({name: sum(e["tid"] == tid for e in spans) for tid, name in lanes.items()}, "spans per lane")
PY
stamp gantt
[ -n "${NO_BUNDLE:-}" ] || bundle
