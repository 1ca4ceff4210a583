#!/bin/bash
# Fixed `draft` mode's speed against gamma1 at 4K of Emma, greedy (SmolLM2 bfloat16, 256 new tokens, two
# repeats taking turns), on the AMX Xeon. Run from the repository root. sweep_l4096_greedy.json ran on the
# working tree of 29a5962 (whose changes are auto's planner: fixed modes do not plan).
set -e
out=benchmarks/results/issue12/gammas
common="--text ${TEXT:-../shared/data/austen-emma.txt} --max-new-tokens 256"
source benchmarks/resumable_bench.sh
resumable ${1:-sweep}_l4096_greedy --lengths 4096 --temperatures 0 --modes ar draft --sweep gamma1=3,4,5,6,8 --repeats 2
