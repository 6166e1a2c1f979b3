#!/usr/bin/env bash
# Session 14's fourth device call (about 4 minutes): the dispatch floors on the user's path. A
# fresh host cache, so the first `slide train` measures the machine with the floor probe; then
# the README's tiny-llama line, llama-3.2-1b batch 1 seq 128 (which before the floors ran at
# +244% of its prediction and cut the cached GPU rates 3.3-fold), and llama-3.2-3b batch 16 with
# the defaults, 12 steps; the cached profile after each, and each trace's op medians.
#   carry [".clean"]; command: cd .clean && bash bench/device/h200_floors.sh
source bench/device/h200_env.sh
source bench/device/h200_kept_runs.sh
source bench/device/h200_traced_train.sh
rm -rf ~/.cache/slide/machines
cached() { cp ~/.cache/slide/machines/*.toml "$OUT/machine-after-$1.toml"; grep -c "re-fit" "$OUT/machine-after-$1.toml"; }
traced_train tiny 0.005 --model tiny-llama --steps 40 --lr 3e-3
cached tiny
tokens 30000000
traced_train 1b-b1 0.005 --model llama-3.2-1b --data /tmp/tok.npy --batch 1 --seq 128 --steps 24
cached 1b-b1
traced_train 3b-b16 0.005 --model llama-3.2-3b --data /tmp/tok.npy --batch 16 --seq 1024 --steps 12
cached 3b-b16
python3 bench/device/trace_op_medians.py --machine "$OUT/machine-after-tiny.toml" "$OUT"/*-trace.json
python3 -m slide.cli simulate --machine "$OUT/machine-after-3b-b16.toml" --model llama-3.2-1b --batch 1 --seq 128 | grep -E "step time|throughput"
stamp done
[ -n "${NO_BUNDLE:-}" ] || bundle
