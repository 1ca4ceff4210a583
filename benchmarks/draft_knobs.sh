#!/usr/bin/env bash
# Does each knob of train-draft help? Short runs (same steps, same cached target labels) of the shipped
# draft's recipe with one knob changed; each prints its held-out report (agreement, expected acceptance
# at temperature 0.6, draft ms per token). Results: one JSON line per run in $OUT/draft_knobs.jsonl.
set -euo pipefail
OUT=${1:-bench-out}
DATA=${DATA:-../shared/data}
STEPS=${STEPS:-100}
TRIFORCE=${TRIFORCE:-triforce}
mkdir -p "$OUT"
texts=("$DATA/austen-prideprejudice.txt" "$DATA/austen-sensesensibility.txt" "$DATA/austen-mansfieldpark.txt"
       "$DATA/austen-persuasion.txt" "$DATA/austen-northangerabbey.txt")
work=${WORK:-${TRIFORCE_HOME:-$HOME/.cache/triforce}/train-draft/smollm2}   # shares the shipped draft's labels
: > "$OUT/draft_knobs.jsonl"
for knobs in "" "--layers 2" "--hidden 256 --heads 4 --intermediate 768" "--vocab 0"; do
    name=$(echo "default $knobs" | tr ' ' '_' | tr -s '_')
    # shellcheck disable=SC2086
    $TRIFORCE train-draft --target smollm2 --text "${texts[@]}" --heldout "$DATA/austen-emma.txt" \
        --out "$OUT/knob-$name" --work-dir "$work" --steps "$STEPS" $knobs \
        | python -c "import json,sys; r=json.loads(sys.stdin.read().splitlines()[-1]); r['knobs']='$knobs'; print(json.dumps(r))" \
        >> "$OUT/draft_knobs.jsonl"
done
