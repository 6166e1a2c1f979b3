#!/usr/bin/env bash
# A refactor's must-not-regress figures on the H200, one call (bundled into $OUT/all.tgz):
# `slide train` with its defaults (seq 1024, batch 16, $STEPS steps, 10 unless set) on the cases in $CASES, run by
# the tree before the change (.before, a `git archive` of the commit) and by this tree,
# alternating before / after for $ROUNDS rounds so that drift falls on both. The summary's
# tokens/s of each run goes to $OUT/before_after.jsonl; the last lines compare medians.
#   rm -rf .before && mkdir .before && git archive COMMIT | tar -x -C .before
#   carry [".whl", ".before"]; command: ROUNDS=2 bash bench/device/h200_before_after.sh
# CASES: "label:flags" items separated by ';' (flags joined by ','), e.g. the default below;
# AFTER_FLAGS (joined by ','): flags for this tree only, where a default changed in between
# (e.g. "--clip,none" against a tree from before global clipping became the default).
# TREES: which trees run each case, in order (default "before after"; "after" alone measures
# this tree without the comparison).
source bench/device/h200_env.sh
CASES=${CASES:-"3b-defaults:--model,llama-3.2-3b;8b-defaults:--model,llama-3.1-8b;3b-sliding:--model,llama-3.2-3b,--placement,small"}
ROUNDS=${ROUNDS:-2}
TREES=${TREES:-"before after"}
bundle() { tar czf /tmp/all.tgz -C "$OUT" . && mv /tmp/all.tgz "$OUT/all.tgz"; }
python3 -c "import numpy as np; np.save('/tmp/tok.npy', np.random.default_rng(0).integers(0, 128000, 4_000_000))"
run() {  # tree label flags...
  local tree=$1 label=$2; shift 2
  # each tree its own --machine auto profile and re-fits: probed by its own code
  (cd "$tree" && XDG_CACHE_HOME="/tmp/slide-cache-${label%%-*}" PYTHONPATH=/tmp/site:$PWD \
     timeout 170 python3 -m slide.cli train \
     --data /tmp/tok.npy --steps "${STEPS:-10}" --no-progress "$@" > "$OUT/$label.json" 2> "$OUT/$label.err")
  python3 - "$OUT/$label.json" "$label" >> "$OUT/before_after.jsonl" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
summary = json.loads(text[text.index("{"):]) if "{" in text else {}
print(json.dumps({"run": sys.argv[2], "tokens_per_s": summary.get("tokens_per_s"),
                  "step_time_error": summary.get("step_time_error")}))
PY
  tail -1 "$OUT/before_after.jsonl"
}
for round in $(seq "$ROUNDS"); do
  IFS=';' read -ra items <<< "$CASES"
  for item in "${items[@]}"; do
    label=${item%%:*}; IFS=',' read -ra flags <<< "${item#*:}"
    IFS=',' read -ra extra <<< "${AFTER_FLAGS:-}"
    for tree in $TREES; do
      if [ "$tree" = before ]; then run .before "before-$label-$round" "${flags[@]}"
      else run . "after-$label-$round" "${flags[@]}" "${extra[@]}"; fi
    done
  done
  stamp "round $round"
done
python3 - "$OUT/before_after.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
labels = dict.fromkeys(r["run"].split("-", 1)[1].rsplit("-", 1)[0] for r in rows)
for what in labels:
    got = {w: [r["tokens_per_s"] for r in rows
               if r["run"].rsplit("-", 1)[0] == f"{w}-{what}" and r["tokens_per_s"]]
           for w in ("before", "after")}
    if all(got.values()):
        b, a = statistics.median(got["before"]), statistics.median(got["after"])
        print(f"{what}: before {b:,.0f} tok/s, after {a:,.0f} tok/s ({100 * (a / b - 1):+.1f}%)")
PY
bundle
