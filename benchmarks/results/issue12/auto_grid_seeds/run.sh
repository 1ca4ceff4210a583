#!/bin/bash
# Mode auto against the fixed modes at 2K and 4K of Emma, batch 1, 256 new tokens: greedy once, 0.6 over
# seeds 0-4 (one bench per seed: at 0.6 a run's speed follows the text it samples), one calibration
# shared by the runs in order. The code of e16867b:
#   git worktree add /tmp/tf-e16867b e16867b && PYTHONPATH=/tmp/tf-e16867b bash benchmarks/results/issue12/auto_grid_seeds/run.sh
# Tables: python benchmarks/auto_table.py FILES; python benchmarks/seed_means.py FILES --against draft (or triforce)
set -e
out=benchmarks/results/issue12/auto_grid_seeds
text=${TEXT:-../shared/data/austen-emma.txt}
home=${HOME_FOR_RUN:-/tmp/triforce_home_grid_seeds}
common="--text $text --max-new-tokens 256 --modes ar draft triforce auto"
source benchmarks/resumable_bench.sh
calibration_home $home
for length in 2048 4096; do
  TRIFORCE_HOME=$home resumable greedy_${length} --lengths $length --temperatures 0
  for seed in 0 1 2 3 4; do
    TRIFORCE_HOME=$home resumable l${length}_sampled_seed$seed --lengths $length --temperatures 0.6 --seed $seed
  done
done
