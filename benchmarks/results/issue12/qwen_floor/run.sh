#!/bin/bash
# Mode auto against the fixed modes on the Qwen2.5-Coder pair (1.5B target, 0.5B draft; `triforce
# fetch-model` both first), batch 1, 128 new tokens of Emma: 8K and 16K at temperatures 0 and 0.6, then 32K
# greedy against `ar`; one fresh calibration per label shared in order. Run from the repository root with
# the label's code first on the path:
#   git worktree add /tmp/tf-X X && PYTHONPATH=/tmp/tf-X bash benchmarks/results/issue12/qwen_floor/run.sh LABEL
# Table: python benchmarks/auto_table.py benchmarks/results/issue12/qwen_floor/*.json
set -e
label=${1:?label}
out=benchmarks/results/issue12/qwen_floor
text=${TEXT:-../shared/data/austen-emma.txt}
home=${HOME_FOR_RUN:-/tmp/triforce_home_qwen_$label}
common="--model qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --text $text --max-new-tokens 128"
source benchmarks/resumable_bench.sh
calibration_home $home
TRIFORCE_HOME=$home resumable ${label}_8k --lengths 7936 --temperatures 0 0.6 --modes ar draft retrieval triforce auto
TRIFORCE_HOME=$home resumable ${label}_16k --lengths 16000 --temperatures 0 0.6 --modes ar draft retrieval triforce auto
TRIFORCE_HOME=$home resumable ${label}_32k --lengths 32000 --temperatures 0 --modes ar auto
