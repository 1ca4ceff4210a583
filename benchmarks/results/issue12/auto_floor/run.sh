#!/bin/bash
# Mode auto against the fixed modes on the README's single-sequence grid (SmolLM2 bfloat16, 2K, 4K and 8K
# of Emma, batch 1, 256 new tokens): greedy once, 0.6 one bench per seed 0-4 (a run's speed at 0.6 follows
# the text it samples), with one fresh calibration (costs and priors) per label shared by the runs in
# order, as a user's machine would. Run from the repository root with the label's code first on the path:
#   git worktree add /tmp/tf-X X && PYTHONPATH=/tmp/tf-X bash benchmarks/results/issue12/auto_floor/run.sh LABEL
# Tables: python benchmarks/auto_table.py FILES; python benchmarks/seed_means.py FILES --against draft
set -e
label=${1:?label}
out=benchmarks/results/issue12/auto_floor
text=${TEXT:-../shared/data/austen-emma.txt}
home=${HOME_FOR_RUN:-/tmp/triforce_home_floor_$label}
common="--text $text --max-new-tokens 256 --modes ar draft triforce auto"
source benchmarks/resumable_bench.sh
calibration_home $home
for length in ${LENGTHS:-2048 4096 7936}; do
  TRIFORCE_HOME=$home resumable ${label}_l${length}_greedy --lengths $length --temperatures 0
  for seed in ${SEEDS:-0 1 2 3 4}; do
    TRIFORCE_HOME=$home resumable ${label}_l${length}_sampled_seed$seed --lengths $length --temperatures 0.6 --seed $seed
  done
done
