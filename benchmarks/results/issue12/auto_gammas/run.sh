#!/bin/bash
# Mode auto against fixed `triforce` (gamma1 4, take-all target checks), 8K of Emma, batch 1, 256 new
# tokens: greedy with two repeats, 0.6 one bench per seed 0-2. Each label runs with its own fresh
# calibration (costs and priors) in $TRIFORCE_HOME, which its runs share in the order below (as a user's
# machine would). "before": the code of ec9a50c (auto pooled each proposer's checks over every gamma);
# "after": fb37432 (each gamma scored from its own checks, and a bottom gamma never run tried once where
# scored near the best); "longer": 6568213 (as "after", trying only longer gammas). Run this script from
# the repository root with the label's code first on the path:
#   git worktree add /tmp/tf-ec9a50c ec9a50c && PYTHONPATH=/tmp/tf-ec9a50c bash benchmarks/results/issue12/auto_gammas/run.sh before
#   git worktree add /tmp/tf-fb37432 fb37432 && PYTHONPATH=/tmp/tf-fb37432 bash benchmarks/results/issue12/auto_gammas/run.sh after
#   git worktree add /tmp/tf-6568213 6568213 && PYTHONPATH=/tmp/tf-6568213 bash benchmarks/results/issue12/auto_gammas/run.sh longer
set -e
label=${1:?before or after}
out=benchmarks/results/issue12/auto_gammas
text=${TEXT:-../shared/data/austen-emma.txt}
home=${HOME_FOR_RUN:-/tmp/triforce_home_gammas_$label}
common="--text $text --lengths 7936 --max-new-tokens 256"
source benchmarks/resumable_bench.sh
calibration_home $home
TRIFORCE_HOME=$home resumable ${label}_greedy --temperatures 0 --repeats 2 --modes ar triforce auto
for seed in 0 1 2; do TRIFORCE_HOME=$home resumable ${label}_sampled_seed$seed --temperatures 0.6 --seed $seed --modes ar triforce auto; done
# More seeds at 0.6 (one run's auto/fixed ratio is mostly its sample path: auto's differs from the fixed
# mode's text), without `ar`: `SEEDS="3 4 5 6 7 8 9 10" bash run.sh LABEL` after the runs above.
for seed in ${SEEDS:-}; do
  TRIFORCE_HOME=$home resumable ${label}_sampled_seed$seed --temperatures 0.6 --seed $seed --modes triforce auto
done
