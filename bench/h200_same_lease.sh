#!/usr/bin/env bash
# One device call, one machine lease: calibrate, then plan every point with that calibration and
# run it (traces + saved plans for bench/accuracy.py): llama-3.2-3b batch 16 streamed (inputs on
# the GPU and on the host) and pure, with the compute-only ceiling; llama-3.1-8b batch 16
# streamed with its ceiling; 3B pure at batch 32 and 48 (the critical batch); 8B batch 8 with
# resident=auto.     bash bench/h200_same_lease.sh "$OUT"      (carry .whl)
set -uo pipefail
out=${1:?output directory}
source bench/h200_env.sh
timeout 150 python3 -c "from slide.cli import main; raise SystemExit(main(['calibrate', '--name', 'h200-16c-128g', '--out', '$out/calibrated.toml']))" 2>&1 | tail -2
stamp calibrate
machine="$out/calibrated.toml"
[ -f "$machine" ] || machine=bench/data/h200-calibrated.toml
run() {
  timeout "$1" python3 -m bench.train_throughput --machine "$machine" --traces "$out/traces" \
    --out "$out/throughput.jsonl" "${@:2}" 2>&1 | grep -v "^INFO" | cut -c1-400
}
run 220 --model llama-3.2-3b --batch 16 --variants streamed=auto+activations=gpu,pure,streamed=auto --compute-only
stamp 3b-b16
run 160 --model llama-3.1-8b --batch 16 --variants streamed=auto+activations=gpu --compute-only
stamp 8b-b16
run 130 --model llama-3.2-3b --batch 32,48 --variants pure
stamp 3b-b32-48
run 100 --model llama-3.1-8b --batch 8 --variants resident=auto
stamp 8b-b8
dmesg 2>/dev/null | grep -i -E "killed process|out of memory" | tail -3
tar czf "$out/traces.tgz" -C "$out" traces && rm -rf "$out/traces"
