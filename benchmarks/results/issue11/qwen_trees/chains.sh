#!/bin/bash
# run.sh's companion: the chains that trees must beat with the Qwen pair, whose 0.5B draft costs about a
# third of the 1.5B target's forward, so shorter chains than the default gamma1 4 may pay more. `draft`
# mode, chains of gamma1 1, 2 and 3: greedy (two repeats) and at 0.6 on run.sh's seeds, into the same
# label's folder and calibration home. Run from the repository root with .venv/bin on PATH, after run.sh:
#   bash benchmarks/results/issue11/qwen_trees/chains.sh LABEL
set -e
label=${1:?label}
source benchmarks/resumable_bench.sh
labelled_runs benchmarks/results/issue11/qwen_trees qwen_trees "$label"
common="--model qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --text $text --lengths ${LENGTH:-4096}
  --max-new-tokens 128 --prefix-cache-gb 1 --modes draft"
TRIFORCE_HOME=$home resumable greedy_chains --temperatures 0 --sweep gamma1=${GAMMAS:-1,2,3} --repeats 2
for seed in ${SEEDS:-0 1 2 3}; do
  TRIFORCE_HOME=$home resumable chains_seed$seed --temperatures 0.6 --sweep gamma1=${GAMMAS:-1,2,3} --seed $seed
done
