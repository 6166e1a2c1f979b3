#!/usr/bin/env bash
# Next session's second device call (under 8 minutes): issue 18's `--optimizer nvme` with
# calibrate's probe that reads and overwrites in turn (session 11): llama-3.2-3b batch 16,
# every unit sliding, 38.6 GB of state on the disk, 3 steps, against the prediction from the
# profile calibrated just before on the same lease.
#   carry [".clean"]; command: cd .clean && bash bench/device/h200_session12b.sh
RUNS=optimizer STEPS=3 bash bench/device/h200_nvme.sh
