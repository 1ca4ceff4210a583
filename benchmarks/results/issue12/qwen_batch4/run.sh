#!/bin/bash
# The Qwen2.5-Coder pair (1.5B target, 0.5B draft; `triforce fetch-model` both first) at batch 4: four
# prompts of Emma (LENGTH tokens each, default 7936, from tokens 0, LENGTH, 2 LENGTH, 3 LENGTH), 128 new
# tokens each, greedy and 0.6 (TEMPERATURES); every mode and auto (MODES), with a fresh calibration per
# label; REPEATS=R runs each mode R times, taking turns (medians). The prompts' KV is kept for the modes
# after the first (--prefix-cache-gb, PREFIX_GB: 4 x 16K tokens of the 1.5B take 1.8 GB). Run from the
# repository root with the label's code first on the path:
#   git worktree add /tmp/tf-X X && PYTHONPATH=/tmp/tf-X bash benchmarks/results/issue12/qwen_batch4/run.sh LABEL [LENGTH]
# Table: python benchmarks/auto_table.py benchmarks/results/issue12/qwen_batch4/*.json
set -e
label=${1:?label}
length=${2:-7936}
out=benchmarks/results/issue12/qwen_batch4
text=${TEXT:-../shared/data/austen-emma.txt}
home=${HOME_FOR_RUN:-/tmp/triforce_home_qwen_batch4_$label}
common="--model qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --text $text --max-new-tokens 128 --batch 4"
source benchmarks/resumable_bench.sh
calibration_home $home
name=${label}_$([ "$length" = 7936 ] && echo 8k || echo "$((length / 1000))k")
TRIFORCE_HOME=$home resumable $name --lengths $length --temperatures ${TEMPERATURES:-0 0.6} \
  --modes ${MODES:-ar draft retrieval triforce auto} --prefix-cache-gb ${PREFIX_GB:-3} --repeats ${REPEATS:-1}
