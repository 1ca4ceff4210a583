#!/bin/bash
# SmolLM2 (the default model and draft) at batch 2, 4 and 8: 8K prompts cut from the six novels (prompt i
# from novel i mod 6), 128 new tokens each, greedy and 0.6; every fixed mode and auto, with a fresh
# calibration per label. Run from the repository root with the label's code first on the path:
#   git worktree add /tmp/tf-X X && PYTHONPATH=/tmp/tf-X bash benchmarks/results/issue12/smollm2_batches/run.sh LABEL
# OUT: another results folder (a CPU's own); PREFIX_CACHE_GB: bench --prefix-cache-gb (each batch's prompts
# are prefilled once and every run restores them; 3 holds SmolLM2's eight 8K prompts); REPEATS: bench --repeats (modes take turns).
# Table: python benchmarks/auto_table.py benchmarks/results/issue12/smollm2_batches/*.json
set -e
label=${1:?label}
out=${OUT:-benchmarks/results/issue12/smollm2_batches}
home=${HOME_FOR_RUN:-/tmp/triforce_home_smollm2_batches_$label}
common="--text ../shared/data/austen-*.txt --max-new-tokens 128 --lengths 7936"
source benchmarks/resumable_bench.sh
calibration_home $home
TRIFORCE_HOME=$home resumable ${label} --batch ${BATCHES:-2 4 8} --temperatures 0 0.6 --modes ar draft retrieval triforce auto \
  --prefix-cache-gb ${PREFIX_CACHE_GB:-0} --repeats ${REPEATS:-1}
