#!/usr/bin/env bash
# Issue 16's must-not-regress figures on the H200, one call (under 9 minutes; bundled into
# $OUT/all.tgz): llama-3.2-3b batch 16 seq 1024, `slide train` with its defaults and with
# `--placement small` (pure sliding), 10 steps each, run by the tree before the executor ran the
# Graph's values (.before: commit d3d7e18, the last with executor/binding.py) and by this tree,
# alternating before / after twice so that drift falls on both. The summary's tokens/s (from the
# trace window) of each run goes to $OUT/before_after.jsonl; the last lines compare medians.
#   rm -rf .before && mkdir .before && git archive d3d7e18 | tar -x -C .before
#   carry [".whl", ".before"]; command: bash bench/device/h200_ir_before_after.sh
source bench/device/h200_env.sh
bundle() { tar czf /tmp/all.tgz -C "$OUT" . && mv /tmp/all.tgz "$OUT/all.tgz"; }
python3 -c "import numpy as np; np.save('/tmp/tok.npy', np.random.default_rng(0).integers(0, 128000, 2_000_000))"
run() {  # tree label extra-flags...
  local tree=$1 label=$2; shift 2
  (cd "$tree" && PYTHONPATH=/tmp/site:$PWD timeout 120 python3 -m slide.cli train \
     --model llama-3.2-3b --data /tmp/tok.npy --batch 16 --seq 1024 --steps 10 --no-progress "$@" \
     > "$OUT/$label.json" 2> "$OUT/$label.err")
  python3 - "$OUT/$label.json" "$label" >> "$OUT/before_after.jsonl" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
summary = json.loads(text[text.index("{"):]) if "{" in text else {}
print(json.dumps({"run": sys.argv[2], "tokens_per_s": summary.get("tokens_per_s")}))
PY
  tail -1 "$OUT/before_after.jsonl"
}
for round in 1 2; do
  run .before "before-defaults-$round"
  run . "after-defaults-$round"
  run .before "before-sliding-$round" --placement small
  run . "after-sliding-$round" --placement small
  stamp "round $round"
done
python3 - "$OUT/before_after.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for what in ("defaults", "sliding"):
    got = {w: [r["tokens_per_s"] for r in rows if r["run"].startswith(f"{w}-{what}") and r["tokens_per_s"]]
           for w in ("before", "after")}
    if all(got.values()):
        b, a = statistics.median(got["before"]), statistics.median(got["after"])
        print(f"{what}: before {b:,.0f} tok/s, after {a:,.0f} tok/s ({100 * (a / b - 1):+.1f}%)")
PY
bundle
