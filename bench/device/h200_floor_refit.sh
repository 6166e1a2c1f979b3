#!/usr/bin/env bash
# Session 14's last device call (under 3 minutes): the floors re-fitted by the run. A fresh host
# cache; the README's tiny-llama line twice (the first measures the machine, and its floor-bound
# GPU lane re-fits the cached floors; the second plans with them), then llama-3.2-1b batch 1 seq
# 128 twice; the cached profile after each run.
#   carry [".clean"]; command: cd .clean && bash bench/device/h200_floor_refit.sh
source bench/device/h200_env.sh
source bench/device/h200_kept_runs.sh
source bench/device/h200_traced_train.sh
rm -rf ~/.cache/slide/machines
cached() { cp ~/.cache/slide/machines/*.toml "$OUT/machine-after-$1.toml"; grep "floor_s = " "$OUT/machine-after-$1.toml"; }
traced_train tiny-1 0.005 --model tiny-llama --steps 40 --lr 3e-3
cached tiny-1
traced_train tiny-2 0.005 --model tiny-llama --steps 40 --lr 3e-3
cached tiny-2
tokens 3000000
traced_train 1b-b1-1 0.005 --model llama-3.2-1b --data /tmp/tok.npy --batch 1 --seq 128 --steps 24
cached 1b-b1-1
traced_train 1b-b1-2 0.005 --model llama-3.2-1b --data /tmp/tok.npy --batch 1 --seq 128 --steps 24
cached 1b-b1-2
stamp done
[ -n "${NO_BUNDLE:-}" ] || bundle
