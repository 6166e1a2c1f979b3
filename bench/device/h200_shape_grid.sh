#!/usr/bin/env bash
# Issue 30's prediction grid on the H200: `slide train` as a user runs it on catalog shapes,
# each run's step time against its prediction (bench/speed/shape_grid.py). GRID_GROUPS picks the
# groups in order (default: cold grid-a preset); BUDGET_S caps each group's start times.
#   GRID_GROUPS="grid-b top3" bash bench/device/h200_shape_grid.sh    (repo root; carry .whl; $OUT set)
set -uo pipefail
source bench/device/h200_env.sh
OUT=${OUT:?the device runner sets OUT}
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch; p = torch.cuda.get_device_properties(0); print('torch', torch.__version__, 'SMs', p.multi_processor_count)"
  free -g; echo "cpus $(nproc)"; git log -1 --oneline 2>/dev/null
} > "$OUT/env.txt" 2>&1
for group in ${GRID_GROUPS:-cold grid-a preset}; do
  stamp "$group"
  python3 -m bench.speed.shape_grid --group "$group" --out /tmp/grid --budget-s "${BUDGET_S:-400}"
done
stamp done
cp /tmp/grid/*.jsonl "$OUT/" 2>/dev/null
cp ~/.cache/slide/machines/*.toml "$OUT/" 2>/dev/null
tar czf "$OUT/logs.tgz" -C /tmp/grid . 2>/dev/null
ls "$OUT"
