# Sourced by device scripts: `traced_train NAME SWITCH_INTERVAL_S ARGS...` runs `slide train
# --no-progress ARGS` with the interpreter's GIL switch interval set, its measured trace (Slide's
# format), metrics, summary and log under $OUT/NAME*, and prints the summary's throughput,
# prediction, placement and re-fit factors.
traced_train() {
  local name=$1 switch=$2
  shift 2
  timeout 150 python3 -c "import sys; sys.setswitchinterval($switch); from slide.cli import main; \
raise SystemExit(main(sys.argv[1:]))" train --no-progress --save-trace "$OUT/$name-trace.json" \
    --metrics "$OUT/$name.jsonl" "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"
  echo "rc=$?" >> "$OUT/$name.err"
  python3 - "$OUT/$name.json" "$name" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
s = json.loads(text[text.index("{"):]) if "{" in text else {}
print(f"{sys.argv[2]}: {s.get('tokens_per_s', 0):,.0f} tok/s, predicted {s.get('predicted_tokens_per_s')}, "
      f"error {s.get('step_time_error')}, {s.get('placement')}, replan {s.get('replan', {}).get('factors')}")
PY
  tail -1 "$OUT/$name.err"
  stamp "$name"
}
