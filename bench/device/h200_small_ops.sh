#!/usr/bin/env bash
# Session 14's third device call (about 4 minutes): where the time of small GPU ops goes. The
# README's `slide train --model tiny-llama` ran 214x its prediction on the H200 (session 14, call
# 2): each layer op took ~2 ms of GPU lane where the profile's rates give ~10 us. Measured traces
# (Slide's format) of that line as is, with the interpreter's GIL switch interval at 0.2 ms
# instead of 5 ms, and with `--schedule gpu-only` (no other lane running beside the GPU's); then
# llama-3.2-1b batch 1 seq 128 sliding and gpu-only, the smallest shape of a real model.
#   carry [".clean"]; command: cd .clean && bash bench/device/h200_small_ops.sh
source bench/device/h200_env.sh
source bench/device/h200_kept_runs.sh
source bench/device/h200_traced_train.sh
traced_train tiny 0.005 --model tiny-llama --steps 40 --lr 3e-3
traced_train tiny-switch 0.0002 --model tiny-llama --steps 40 --lr 3e-3
traced_train tiny-gpu-only 0.005 --model tiny-llama --steps 40 --lr 3e-3 --schedule gpu-only
tokens 3000000
traced_train 1b-b1 0.005 --model llama-3.2-1b --data /tmp/tok.npy --batch 1 --seq 128 --steps 24
traced_train 1b-b1-gpu-only 0.005 --model llama-3.2-1b --data /tmp/tok.npy --batch 1 --seq 128 --steps 24 --schedule gpu-only
cp ~/.cache/slide/machines/*.toml "$OUT/" 2>/dev/null
[ -n "${NO_BUNDLE:-}" ] || bundle
