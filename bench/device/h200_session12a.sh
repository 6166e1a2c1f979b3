#!/usr/bin/env bash
# Session 12's first device call, and session 13's (under 9 minutes; run again after the tuple
# free lists were filled after step 1): issue 14's soak as the issue names it,
# llama-3.2-3b batch 16 with the defaults, 600 steps (0.61 s/step: the re-plan check's 6-step
# pass, 9 whole 64-step passes, an 18-step last pass whose engine is made before the steady
# state), RSS and the pinned host pool every 16 steps, fits from steps 200 and 400.
#   carry [".clean"]; command: cd .clean && bash bench/device/h200_session12a.sh
SOAK_MODEL=llama-3.2-3b SOAK_STEPS=600 SOAK_LIMIT=470 SOAK_SKIPS="200 400" bash bench/device/h200_soak_long.sh
