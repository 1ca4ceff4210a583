#!/bin/bash
# Trees shaped by the draft's confidence as they grow (--tree-shape confidence: the chain of gamma1 4, then
# the nodes that pay for the costs measured on this machine), against that chain, in `triforce` mode.
# Greedy: one bench with two repeats. 0.6: one bench per seed (a single sample path decides acceptance).
# Resumable: a finished file is kept. Run from the repository root; tables by
#   python benchmarks/tree_seeds.py benchmarks/results/issue11/confidence_trees/*.json
set -e
out=benchmarks/results/issue11/confidence_trees
text=${TEXT:-../shared/data/austen-emma.txt}
common="--text $text --lengths 7936 --max-new-tokens 256 --modes ar triforce --tree-shape confidence"
source benchmarks/resumable_bench.sh
resumable greedy --temperatures 0 --sweep tree1=0,6,8 --repeats 2
for seed in 0 1 2; do resumable sampled_seed$seed --temperatures 0.6 --sweep tree1=0,6,8 --seed $seed; done
# One sample path says little at 0.6 (the chain's accepted per tier-2 check ranged 1.8-3.1 over seeds):
# nine more paths for the chain against tree 6.
for seed in 3 4 5 6 7 8 9 10 11; do resumable sampled6_seed$seed --temperatures 0.6 --sweep tree1=0,6 --seed $seed; done
