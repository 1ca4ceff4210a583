#!/bin/bash
# The Qwen2.5-Coder pair (1.5B target, 0.5B draft; `triforce fetch-model` both first) at batch 4: four 8K
# prompts of Emma (from tokens 0, 7936, 15872, 23808), 128 new tokens each, greedy and 0.6; every mode and
# auto, with a fresh calibration per label. Run from the repository root with the label's code first on
# the path:
#   git worktree add /tmp/tf-X X && PYTHONPATH=/tmp/tf-X bash benchmarks/results/issue12/qwen_batch4/run.sh LABEL
# Table: python benchmarks/auto_table.py benchmarks/results/issue12/qwen_batch4/*.json
set -e
label=${1:?label}
out=benchmarks/results/issue12/qwen_batch4
text=${TEXT:-../shared/data/austen-emma.txt}
home=${HOME_FOR_RUN:-/tmp/triforce_home_qwen_batch4_$label}
common="--model qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --text $text --max-new-tokens 128 --batch 4"
source benchmarks/resumable_bench.sh
calibration_home $home
TRIFORCE_HOME=$home resumable ${label}_8k --lengths 7936 --temperatures 0 0.6 --modes ar draft retrieval triforce auto
