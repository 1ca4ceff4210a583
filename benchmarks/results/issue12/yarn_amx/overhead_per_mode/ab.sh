#!/bin/bash
# Mode auto against `draft` at SmolLM2 + yarn:4, 32K of Emma, greedy and 0.6 (seed 0), 256 new tokens, two
# builds taking turns (each its own fresh calibration home, shared by its turns): BEFORE and AFTER are
# checkouts (git worktree add --detach /tmp/wt_before f807905; ... /tmp/wt_after e4eeca7). Resumable.
# Run from the repository root: bash benchmarks/results/issue12/yarn_amx/overhead_per_mode/ab.sh /tmp/wt_before /tmp/wt_after
# Table: python benchmarks/results/issue12/yarn_amx/overhead_per_mode/table.py
set -e
out=$(dirname "$0")
declare -A code=([before]=${1:?BEFORE checkout} [after]=${2:?AFTER checkout})
source benchmarks/resumable_bench.sh
for b in before after; do calibration_home /tmp/triforce_home_overhead_$b; done
for turn in 1 2 3 4 5; do
  for b in before after; do
    f=$out/${b}_turn$turn.json
    [ -f $f ] && continue
    PYTHONPATH=${code[$b]} TRIFORCE_HOME=/tmp/triforce_home_overhead_$b python -m triforce bench \
      --text ../shared/data/austen-emma.txt --max-new-tokens 256 --rope-scaling yarn:4 --modes draft auto \
      --lengths 32000 --temperatures 0 0.6 --prefix-cache-gb 2 --out $f.tmp > $f.log 2>&1 && mv $f.tmp $f
  done
done
