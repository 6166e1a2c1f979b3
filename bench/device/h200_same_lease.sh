#!/usr/bin/env bash
# One device call (under its 10-minute cap), one machine lease: calibrate, then plan every point
# with that calibration and run it (traces + saved plans for bench/speed/accuracy.py): llama-3.2-3b
# batch 16 with the defaults and pure, pure at batch 32 and 48 (the critical batch), llama-3.1-8b
# batch 16 with the defaults, then as time allows 3B batch 16 streamed with inputs on the host
# and 3B batch 8 with the defaults. The traces are packed after every stage, so a stage cut
# short by its timeout loses only itself.     bash bench/device/h200_same_lease.sh "$OUT"   (carry .whl)
set -uo pipefail
out=${1:?output directory}
source bench/device/h200_env.sh
timeout 110 python3 -c "from slide.cli import main; raise SystemExit(main(['calibrate', '--name', 'h200-16c-128g', '--out', '$out/calibrated.toml']))" 2>&1 | tail -2
stamp calibrate
machine="$out/calibrated.toml"
[ -f "$machine" ] || machine=bench/data/h200-calibrated.toml
run() {
  timeout "$1" python3 -m bench.speed.train_throughput --machine "$machine" --traces "$out/traces" \
    --out "$out/throughput.jsonl" "${@:3}" 2>&1 | grep -v "^INFO" | cut -c1-400
  stamp "$2"
  tar czf "$out/traces.tgz" -C "$out" traces
}
run 150 3b-b16 --model llama-3.2-3b --batch 16 --variants streamed=auto+activations=gpu,pure
run 120 3b-b32-48 --model llama-3.2-3b --batch 32,48 --variants pure
run 110 8b-b16 --model llama-3.1-8b --batch 16 --variants streamed=auto+activations=gpu
run 60 3b-b16-host --model llama-3.2-3b --batch 16 --variants streamed=auto
run 50 3b-b8 --model llama-3.2-3b --batch 8 --variants streamed=auto+activations=gpu
dmesg 2>/dev/null | grep -i -E "killed process|out of memory" | tail -3
