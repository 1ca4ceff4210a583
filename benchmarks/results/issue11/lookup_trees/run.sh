#!/bin/bash
# Trees whose nodes take the prompt lookup's copies (on by default, n = 3) against the take-all chain of
# gamma1 4, in `triforce` mode. Greedy: one bench with two repeats; 0.6: one bench per seed. Resumable.
# Run from the repository root: bash benchmarks/results/issue11/lookup_trees/run.sh
set -e
out=benchmarks/results/issue11/lookup_trees
text=${TEXT:-../shared/data/austen-emma.txt}
common="--text $text --lengths 7936 --max-new-tokens 256 --modes ar triforce"
source benchmarks/resumable_bench.sh
resumable greedy --temperatures 0 --sweep tree1=0,4,8 --repeats 2
for seed in 0 1 2; do resumable sampled_seed$seed --temperatures 0.6 --sweep tree1=0,4,8 --seed $seed; done
