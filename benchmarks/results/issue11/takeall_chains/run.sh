#!/bin/bash
# Fixed-mode chains whose target checks take every token of tier 2's rounds (the rounds overshoot gamma2
# by up to gamma1), swept over gamma1; then trees against the chain of gamma1 4 that became the default.
# Greedy: one bench with two repeats. 0.6: one bench per seed (a single sample path decides acceptance).
# Resumable: a finished file is kept. Run from the repository root.
# The files here came from the code of 6358076. To rerun them as they were, run this script (it needs
# benchmarks/resumable_bench.sh, newer than some of them) with that code first on the path:
#   git worktree add /tmp/tf-6358076 6358076 && PYTHONPATH=/tmp/tf-6358076 bash benchmarks/results/issue11/takeall_chains/run.sh
set -e
out=benchmarks/results/issue11/takeall_chains
text=${TEXT:-../shared/data/austen-emma.txt}
common="--text $text --lengths 7936 --max-new-tokens 256 --modes ar triforce"
source benchmarks/resumable_bench.sh
resumable greedy_gamma1 --temperatures 0 --sweep gamma1=2,3,4,6 --repeats 2
for seed in 0 1 2; do resumable sampled_gamma1_seed$seed --temperatures 0.6 --sweep gamma1=2,4 --seed $seed; done
TRIFORCE_CPU_ISA=avx2 resumable greedy_gamma1_avx2 --temperatures 0 --sweep gamma1=2,4 --repeats 2
resumable greedy_trees --temperatures 0 --sweep tree1=0,8 --repeats 2 --gamma1 4
for seed in 0 1 2; do resumable sampled_trees_seed$seed --temperatures 0.6 --sweep tree1=0,8 --seed $seed --gamma1 4; done
