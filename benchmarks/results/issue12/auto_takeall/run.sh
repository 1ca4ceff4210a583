#!/bin/bash
# Mode auto against fixed `triforce` (whose target checks take every token of tier 2's rounds, gamma1 4),
# 8K of Emma, batch 1, 256 new tokens: greedy with two repeats, 0.6 one bench per seed 0-2. Each label
# runs with its own fresh calibration (costs and priors) in $TRIFORCE_HOME, so neither inherits the
# other's learned acceptance. "before": commit 0cd176b (auto's engine checked exactly gamma2 and its
# planner priced that); "after": the commit that made auto take every token and model it. Run from the
# repository root at the commit of the label: bash benchmarks/results/issue12/auto_takeall/run.sh LABEL
set -e
label=${1:?before or after}
out=benchmarks/results/issue12/auto_takeall
text=${TEXT:-../shared/data/austen-emma.txt}
home=${HOME_FOR_RUN:-/tmp/triforce_home_$label}
mkdir -p $home
for d in models downloads; do ln -sfn ${TRIFORCE_HOME:-$HOME/.cache/triforce}/$d $home/$d; done
common="--text $text --lengths 7936 --max-new-tokens 256 --modes ar triforce auto"
source benchmarks/resumable_bench.sh
TRIFORCE_HOME=$home resumable ${label}_greedy --temperatures 0 --repeats 2
for seed in 0 1 2; do TRIFORCE_HOME=$home resumable ${label}_sampled_seed$seed --temperatures 0.6 --seed $seed; done
