#!/bin/bash
# Mode auto at 0.6 in a batch of 8, starting from a priors file that holds the greedy kind only (docs/auto.md,
# *What earlier requests saw*): each checkout in turn runs `draft` and `auto` from its own copy of CALIB (a
# calibration folder whose priors-5.json has greedy batch-8 entries; its entries at 0.6 are dropped), so the
# code before 8938bed starts auto from the defaults and the code since from the greedy kin's speed factors.
# Run from the repository root; NAME=CHECKOUT pairs (the checkouts' own triforce packages, on PYTHONPATH: through
# the console script, as `python -m` from here would import this folder's own first):
#   CALIB=$TRIFORCE_HOME/calibration [FIRST=1] TURNS=2 bash benchmarks/results/issue12/amx17/kin_priors/run.sh \
#       before=/tmp/wt-before after=/tmp/wt-after
set -e
CALIB=${CALIB:?set CALIB} here=$(dirname "$0") home=$(mktemp -d)
for turn in $(seq "${FIRST:-1}" "${TURNS:-1}"); do
  for pair in "$@"; do
    name=${pair%%=*} checkout=${pair#*=}
    rm -rf "$home/calibration" && cp -r "$CALIB" "$home/calibration"
    ln -sfn "${TRIFORCE_MODELS:-$HOME/.cache/triforce/models}" "$home/models"
    .venv/bin/python - "$home/calibration/priors-5.json" <<'PY'
import json, sys
entries = json.load(open(sys.argv[1]))
json.dump({k: v for k, v in entries.items() if "||t=0.60" not in k}, open(sys.argv[1], "w"))
PY
    TRIFORCE_HOME=$home PYTHONPATH=$checkout .venv/bin/triforce bench \
      --text ../shared/data/austen-{emma,mansfieldpark,northangerabbey,persuasion,prideprejudice,sensesensibility}.txt \
      --lengths 7936 --batch 8 --temperatures 0.6 --max-new-tokens 128 --modes draft auto --repeats 1 \
      --prefix-cache-gb 4 --out "$here/b8_t06_${name}_turn${turn}.json" > /dev/null
  done
done
rm -rf "$home"
