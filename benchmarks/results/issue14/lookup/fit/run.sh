#!/usr/bin/env bash
# The prompt lookup's weight, counted (before: `git worktree add ../before ece1cbe`) against fitted (this
# commit), on 4,096 tokens of Emma at 0.6 over seeds 0-7 and greedy at 4,096 and 7,936 tokens; run from a
# checkout of each, LABEL naming its files: bash benchmarks/results/issue14/lookup/fit/run.sh LABEL.
# (sampled_before_s0/1 and sampled_unknown_counted_s0/1 also ran --sweep lookup=0,3: their lookup 0 rows
# are the control, the same code in both.) Table: python benchmarks/results/issue14/lookup/fit/table.py
set -euo pipefail
label=$1
here=$(dirname "$0")
for seed in 0 1 2 3 4 5 6 7; do
  python -m triforce bench --text ../shared/data/austen-emma.txt --lengths 4096 --temperatures 0.6 --max-new-tokens 256 \
    --modes retrieval triforce draft --lookup 3 --prefix-cache-gb 1 --seed $seed --out "$here/sampled_${label}_s$seed.json"
done
python -m triforce bench --text ../shared/data/austen-emma.txt --lengths 4096 7936 --temperatures 0 --max-new-tokens 256 \
  --modes retrieval triforce draft --lookup 3 --prefix-cache-gb 2 --out "$here/greedy_$label.json"
