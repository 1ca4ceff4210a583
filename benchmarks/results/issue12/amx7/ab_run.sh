#!/bin/bash
# Mode auto against draft at batch 8 x 8K and 0.6, two turns, at revision REV, from a fresh priors file
# (this machine's cost table and proposer timings copied, so no cost is measured again):
#   bash benchmarks/results/issue12/amx7/ab_run.sh REV NAME OUT_DIR
# writes OUT_DIR/NAME.json. Run from the repository root, with the venv's triforce on PATH.
set -e
REV=$1; NAME=$2; OUT=$(realpath "$3")
ROOT=$(git rev-parse --show-toplevel); DATA=$(realpath "$ROOT/../shared/data")
HOME_CAL=${TRIFORCE_CALIBRATION:-${TRIFORCE_HOME:-$HOME/.cache/triforce}/calibration}
TREE=$(mktemp -d)/wt; git -C "$ROOT" worktree add -f --detach "$TREE" "$REV" >/dev/null
CAL=$(mktemp -d); cp "$HOME_CAL"/costs-3.json "$HOME_CAL"/proposer-weights-1.json "$CAL"/
cd "$TREE"
TRIFORCE_CALIBRATION=$CAL PYTHONPATH=$TREE python -m triforce bench \
  --text "$DATA"/austen-{emma,mansfieldpark,northangerabbey,persuasion,prideprejudice,sensesensibility}.txt \
  --lengths 7936 --batch 8 --temperatures 0.6 --max-new-tokens 128 --modes draft auto --repeats 2 \
  --prefix-cache-gb 4 --out "$OUT/$NAME.json"
git -C "$ROOT" worktree remove --force "$TREE"
