#!/bin/bash
# Trees whose nodes take the prompt lookup's copies (on by default, n = 3) against the take-all chain of
# gamma1 4, in `triforce` mode. Greedy: one bench with two repeats; 0.6: one bench per seed. Resumable.
# Run from the repository root: bash benchmarks/results/issue11/lookup_trees/run.sh
# The files here came from the code of 0cd176b. To rerun them as they were, run this script (it needs
# benchmarks/resumable_bench.sh, newer than some of them) with that code first on the path:
#   git worktree add /tmp/tf-0cd176b 0cd176b && PYTHONPATH=/tmp/tf-0cd176b bash benchmarks/results/issue11/lookup_trees/run.sh
set -e
out=benchmarks/results/issue11/lookup_trees
text=${TEXT:-../shared/data/austen-emma.txt}
common="--text $text --lengths 7936 --max-new-tokens 256 --modes ar triforce"
source benchmarks/resumable_bench.sh
resumable greedy --temperatures 0 --sweep tree1=0,4,8 --repeats 2
for seed in 0 1 2; do resumable sampled_seed$seed --temperatures 0.6 --sweep tree1=0,4,8 --seed $seed; done
