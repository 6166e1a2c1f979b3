#!/usr/bin/env bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
# Issue 15 on the H200: `slide train` as a user runs it (its defaults: the placement search,
# --machine auto), seq 1024, batch 16, llama-3.2-3b then llama-3.1-8b on random token ids,
# beside `slide plan` and `slide simulate` of the same plans on the same machine profile (the
# one `--machine auto` builds, written to $OUT/auto.toml), the measured and predicted traces
# compared, and $OUT/summary.txt: placement, predicted and measured tokens/s, the issue's
# floors (3B >= 21,000, 8B >= 9,600, each within 5% of its prediction).
# Each training is capped (SIGINT: it finishes the step in flight), the whole under 8 minutes.
# CASES: "MODEL:TAG:STEPS:CAP" items (default: llama-3.2-3b:3b:10:140 llama-3.1-8b:8b:8:220);
# EXTRA: flags added to every plan, simulate and train, e.g. pure sliding as bench/RESULTS.md
# ran it: CASES="llama-3.2-3b:3b:12:150" EXTRA="--placement small".
#   bash bench/device/device_placement.sh        (from the repo root; carry .whl: simpy; $OUT set)
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:?the device runner sets OUT}
mkdir -p "$OUT"
TOKENS=/tmp/slide-placement-tokens.npy
t0=$(date +%s)
stamp() { echo "== $1: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/log.txt"; }
slide() { python3 -m slide.cli "$@"; }

{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  free -g
  echo "cpus $(nproc)"
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
  git log -1 --oneline 2>/dev/null
  git status --short 2>/dev/null | head -40
} > "$OUT/env.txt" 2>&1

# random token ids below every llama-3 vocabulary (128256): 2M tokens, ~120 steps of batch 16
python3 -c "import numpy as np, sys; np.save(sys.argv[1], np.random.default_rng(0).integers(0, 128000, size=2_000_000, dtype=np.int64))" "$TOKENS" || exit 1

# the machine `--machine auto` plans for, as a profile plan and simulate can read
PROFILE="$OUT/auto.toml"
python3 - "$PROFILE" > "$OUT/profile.log" 2>&1 <<'EOF' || PROFILE=h200-16c-128g
import sys
import torch
from slide.train_prepare import resolve_machine
from slide.train_request import TrainRequest
from slide_ir import TrainConfig
from slide_ir.specs.hardware import machine_to_toml

request = TrainRequest(model="llama-3.2-3b", machine="auto", config=TrainConfig(batch=16, seq=1024))
machine = resolve_machine(request, torch.device("cuda"))
with open(sys.argv[1], "w", encoding="utf-8") as f:
    f.write(machine_to_toml(machine))
print(machine.name, machine.gpu.memory_bytes, machine.ram_bytes)
EOF
echo "profile: $PROFILE" | tee -a "$OUT/log.txt"
stamp setup

# one model: plan + simulate (prediction), train (measurement), compare
run_model() {
  local model=$1 tag=$2 steps=$3 cap=$4
  # shellcheck disable=SC2206
  local shape=(--model "$model" --batch 16 --seq 1024 ${EXTRA:-})
  slide plan "${shape[@]}" --machine "$PROFILE" --steps "$steps" --out "$OUT/$tag-plan.json" > "$OUT/$tag-plan.txt" 2>&1
  slide plan "${shape[@]}" --machine "$PROFILE" --steps "$steps" --json > "$OUT/$tag-plan-summary.json" 2>&1
  slide simulate "${shape[@]}" --machine "$PROFILE" > "$OUT/$tag-simulate.txt" 2>&1
  slide simulate "${shape[@]}" --machine "$PROFILE" --json --save-trace "$OUT/$tag-predicted-trace.json" > "$OUT/$tag-simulate.json" 2>&1
  slide simulate "${shape[@]}" --machine "$PROFILE" --placement small --json > "$OUT/$tag-simulate-small.json" 2>&1
  head -6 "$OUT/$tag-plan.txt" | tee -a "$OUT/log.txt"
  stamp "$tag plan + simulate"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$OUT/$tag-gpu-mem-mib.csv" 2>/dev/null &
  local smi=$!
  local timer=()
  [ -x /usr/bin/time ] && timer=(/usr/bin/time -v -o "$OUT/$tag-time.txt")
  timeout -k 20 -s INT "$cap" ${timer[@]+"${timer[@]}"} python3 -m slide.cli -v train "${shape[@]}" --machine auto \
    --steps "$steps" --data "$TOKENS" --metrics "$OUT/$tag-metrics.jsonl" \
    --save-trace "$OUT/$tag-measured-trace.json" --no-progress > "$OUT/$tag-train.json" 2> "$OUT/$tag-train.log"
  local rc=$?
  echo "exit status $rc" >> "$OUT/$tag-train.log"
  echo "$tag train: exit status $rc (124/130: stopped at the $cap s cap)" | tee -a "$OUT/log.txt"
  kill "$smi" 2>/dev/null
  wait "$smi" 2>/dev/null
  tail -4 "$OUT/$tag-train.log"
  stamp "$tag train"
  if [ -s "$OUT/$tag-measured-trace.json" ]; then
    slide compare-trace "$OUT/$tag-predicted-trace.json" "$OUT/$tag-measured-trace.json" > "$OUT/$tag-compare.txt" 2>&1
    cat "$OUT/$tag-compare.txt"
  fi
}

for item in ${CASES:-llama-3.2-3b:3b:10:140 llama-3.1-8b:8b:8:220}; do
  IFS=: read -r model tag steps cap <<< "$item"
  run_model "$model" "$tag" "$steps" "$cap"
done

python3 - "$OUT" > "$OUT/summary.txt" 2>&1 <<'EOF'
"""Per model: the placement planned and the one the measured trace ran, predicted and
measured tokens/s, the issue's floor, the smallest footprint's prediction for reference."""
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
FLOORS = {"3b": 21_000, "8b": 9_600}


def num(x):
    return f"{round(x):,}" if isinstance(x, (int, float)) else "n/a"


def load(name):
    try:
        text = (out / name).read_text()
        return json.loads(text[text.index("{"):])
    except (OSError, ValueError) as exc:
        return {"error": f"{name}: {exc}"}


for tag, floor in FLOORS.items():
    plan, sim, small = load(f"{tag}-plan-summary.json"), load(f"{tag}-simulate.json"), load(f"{tag}-simulate-small.json")
    train = load(f"{tag}-train.json")
    print(f"== {tag}")
    for doc in (plan, sim, small, train):
        if "error" in doc:
            print("  ", doc["error"])
    placement = plan.get("placement") or {}
    chosen = placement.get("chosen") or {}
    print(f"  planned: resident {plan.get('resident_units')} streamed {plan.get('streamed_units')} "
          f"activations {chosen.get('activations')} cache units {chosen.get('cache_units')}")
    ran = set(), set()
    try:
        spans = json.loads((out / f"{tag}-measured-trace.json").read_text())["spans"]
        ran = ({s["layer"] for s in spans if s["kind"] == "gpu_adam"},
               {s["layer"] for s in spans if s["kind"] == "opt_h2d"})
        device = set(plan.get("resident_units", [])) | set(plan.get("streamed_units", []))
        same = ran[0] == device and ran[1] == set(plan.get("streamed_units", []))
        print(f"  measured trace: updated on the GPU {sorted(ran[0])}, streamed {sorted(ran[1])}: "
              f"{'the planned placement' if same else 'NOT the planned placement'}")
    except (OSError, ValueError, KeyError) as exc:
        print(f"  measured trace unreadable: {exc}")
    predicted, measured = sim.get("tokens_per_s"), train.get("tokens_per_s")
    print(f"  predicted {num(predicted)} tokens/s (smallest footprint: "
          f"{num(small.get('tokens_per_s'))}); measured {num(measured)} over "
          f"{train.get('steps_run')} steps")
    if predicted and measured:
        err = measured / predicted - 1
        print(f"  measured/predicted {err:+.1%} (within 5%: {abs(err) <= 0.05}); "
              f">= {floor:,}: {measured >= floor}")
EOF
cat "$OUT/summary.txt"
dmesg 2>/dev/null | grep -i -E "killed process|out of memory" | tail -3
rm -f "$TOKENS"
stamp done
