#!/bin/bash
# Token trees with a real pretrained draft: the Qwen2.5-Coder pair (1.5B target, 0.5B draft; `triforce
# fetch-model` both first) in `draft` mode on LENGTH tokens of Emma (default 4096), 128 new tokens: Sequoia
# trees of the draft against the default chain of gamma1 4, and the shorter chains (gamma1 1, 2, 3) that
# a draft costing a third of its target may favour. SmolLM2's 4-layer draft is what keeps trees level with
# chains there (docs/trees.md); this asks whether a draft that agrees more makes them pay.
# Greedy: one bench per sweep with two repeats. 0.6: one bench per seed and sweep (a sample path decides
# acceptance). The prompt's KV is kept between runs (--prefix-cache-gb). Its own calibration home (the
# tree sizes of `auto` come from its costs). Resumable; run from the repository root with .venv/bin on PATH:
#   bash benchmarks/results/issue11/qwen_trees/run.sh LABEL
# Tables: python benchmarks/tree_seeds.py benchmarks/results/issue11/qwen_trees/LABEL/greedy.json (and on
# greedy_chains.json: one file each); at 0.6, python benchmarks/results/issue11/qwen_trees/table.py
# benchmarks/results/issue11/qwen_trees/LABEL
set -e
label=${1:?label}
source benchmarks/resumable_bench.sh
labelled_runs benchmarks/results/issue11/qwen_trees qwen_trees "$label"
common="--model qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --text $text --lengths ${LENGTH:-4096}
  --max-new-tokens 128 --prefix-cache-gb 1"
TRIFORCE_HOME=$home resumable greedy --modes ar draft --temperatures 0 --sweep tree1=${GREEDY_TREES:-0,4,8,16,auto} --repeats 2
for seed in ${SEEDS:-0 1 2 3}; do
  TRIFORCE_HOME=$home resumable sampled_seed$seed --modes draft --temperatures 0.6 --sweep tree1=${SAMPLED_TREES:-0,8,auto} --seed $seed
done
TRIFORCE_HOME=$home resumable greedy_chains --modes draft --temperatures 0 --sweep gamma1=${GAMMAS:-1,2,3} --repeats 2
for seed in ${SEEDS:-0 1 2 3}; do
  TRIFORCE_HOME=$home resumable chains_seed$seed --modes draft --temperatures 0.6 --sweep gamma1=${GAMMAS:-1,2,3} --seed $seed
done
