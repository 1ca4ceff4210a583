#!/bin/bash
# Mode auto against fixed `triforce` (whose target checks take every token of tier 2's rounds, gamma1 4),
# 8K of Emma, batch 1, 256 new tokens: greedy with two repeats, 0.6 one bench per seed 0-2. Each label
# runs with its own fresh calibration (costs and priors) in $TRIFORCE_HOME, so neither inherits the
# other's learned acceptance. "before": the code of 0cd176b (auto's engine checked exactly gamma2 and its
# planner priced that); "after": the code of 16a3ae4 (auto takes every token and models it). Run this
# script (newer than 0cd176b) from the repository root with the label's code first on the path:
#   git worktree add /tmp/tf-0cd176b 0cd176b && PYTHONPATH=/tmp/tf-0cd176b bash benchmarks/results/issue12/auto_takeall/run.sh before
#   git worktree add /tmp/tf-16a3ae4 16a3ae4 && PYTHONPATH=/tmp/tf-16a3ae4 bash benchmarks/results/issue12/auto_takeall/run.sh after
set -e
label=${1:?before or after}
out=benchmarks/results/issue12/auto_takeall
text=${TEXT:-../shared/data/austen-emma.txt}
home=${HOME_FOR_RUN:-/tmp/triforce_home_$label}
common="--text $text --lengths 7936 --max-new-tokens 256 --modes ar triforce auto"
source benchmarks/resumable_bench.sh
calibration_home $home
TRIFORCE_HOME=$home resumable ${label}_greedy --temperatures 0 --repeats 2
for seed in 0 1 2; do TRIFORCE_HOME=$home resumable ${label}_sampled_seed$seed --temperatures 0.6 --seed $seed; done
