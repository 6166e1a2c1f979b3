#!/usr/bin/env bash
# Ctrl-C and the README's train line on the H200 (one device call, about 8 minutes): the GPU
# tests (`pytest -m gpu tests`); the README's `slide train --model tiny-llama` line;
# then llama-3.2-1b batch 16 seq 1024 with the defaults and `--out`, sent one SIGINT after step 10
# (it must finish the step in flight, save, exit 130, and the checkpoint must load in
# transformers and resume to the end) and two SIGINTs 0.2 s apart (it must abort, exit 130).
#   carry [".clean"]; command: cd .clean && bash bench/device/h200_ctrl_c.sh
source bench/device/h200_env.sh
source bench/device/h200_kept_runs.sh
timeout 300 python3 -m pytest -q -m gpu tests -p no:cacheprovider 2>&1 | tail -5
stamp gpu-tests
(cd /tmp && timeout 120 python3 -m slide.cli train --model tiny-llama --steps 40 --lr 3e-3 \
  --out ckpt-readme --metrics m.jsonl --gantt "$OUT/readme-gantt.png" > "$OUT/readme.json" 2> "$OUT/readme.err";
  echo "rc=$?" >> "$OUT/readme.err")
tail -2 "$OUT/readme.err"; grep -E "steps_done|final_loss|loss_first|checkpoint" "$OUT/readme.json"
stamp readme-train
tokens 3000000
timeout 400 python3 bench/device/ctrl_c_trials.py /tmp/tok.npy "$OUT" 2>&1 | tee "$OUT/ctrl-c.txt"
stamp ctrl-c
[ -n "${NO_BUNDLE:-}" ] || bundle
