#!/bin/bash
# Mode auto of two versions of the code on one machine, interleaved: OLD (a commit, run from a worktree
# with its own kernel build) against the working tree, each starting from a copy of the same cost table and
# no priors. 7,936 tokens of Emma at 0.6 (seeds $SEEDS, by default 0-2, which share their version's home in order as the
# grid's do: priors and any re-measured cost build up there), then 32,000 with yarn:4 greedy; 256 new
# tokens, auto only. Results in $out/LABEL.
#   PATH=$PWD/.venv/bin:$PATH bash benchmarks/results/issue12/avx2_epyc/auto_ab.sh OLD LABEL HOME_8K HOME_32K
# HOME_8K / HOME_32K: calibration homes whose cost tables the runs copy (here run.sh's and yarn.sh's of OLD).
# Tables: python benchmarks/auto_table.py benchmarks/results/issue12/avx2_epyc/LABEL/*.json
set -e
old=${1:?usage: auto_ab.sh OLD LABEL HOME_8K HOME_32K}; label=${2:?}; costs8=${3:?}; costs32=${4:?}
out=$PWD/benchmarks/results/issue12/avx2_epyc/$label
text=${TEXT:-$PWD/../shared/data/austen-emma.txt}
tree=/tmp/triforce_worktree_$old
mkdir -p "$out"
[ -d "$tree" ] || git worktree add --detach "$tree" "$old"
prep() {  # a home with COSTS_FROM's cost table, the usual models, no priors
  rm -rf "$1"; mkdir -p "$1/calibration"
  for d in models downloads; do ln -sfn "${TRIFORCE_HOME:-$HOME/.cache/triforce}/$d" "$1/$d"; done
  cp "$2"/calibration/costs-*.json "$1/calibration/"
}
run() {  # run old|new HOME NAME ARGS...: one bench of auto, unless NAME.json is there
  local which=$1 home=$2 name=$3; shift 3
  [ -f "$out/$name.json" ] && return 0
  if [ "$which" = old ]; then
    (cd "$tree" && PYTHONPATH="$tree" TORCH_EXTENSIONS_DIR="$tree.ext" TRIFORCE_HOME=$home triforce bench \
      --text "$text" --max-new-tokens 256 --modes auto "$@" --out "$out/$name.json.tmp" > "$out/$name.json.log" 2>&1)
  else
    TRIFORCE_HOME=$home triforce bench --text "$text" --max-new-tokens 256 --modes auto "$@" \
      --out "$out/$name.json.tmp" > "$out/$name.json.log" 2>&1
  fi
  mv "$out/$name.json.tmp" "$out/$name.json"
}
homes=/tmp/triforce_ab_$label
if [ ! -d "$homes" ]; then
  for which in old new; do prep "$homes/${which}8" "$costs8"; prep "$homes/${which}32" "$costs32"; done
fi
for seed in ${SEEDS:-0 1 2}; do
  for which in old new; do
    run $which "$homes/${which}8" ${which}_7936_sampled_seed$seed --lengths 7936 --temperatures 0.6 --seed $seed
  done
done
for which in old new; do
  run $which "$homes/${which}32" ${which}_yarn_greedy_32000 --lengths 32000 --temperatures 0 --rope-scaling yarn:4
done
