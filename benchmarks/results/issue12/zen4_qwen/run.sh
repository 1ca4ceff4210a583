#!/bin/bash
# The Qwen2.5-Coder pair (1.5B target, 0.5B draft; `triforce fetch-model` both first) on the 2-core Zen 4,
# batch 1, 128 new tokens of Emma: 7,936 tokens greedy and at 0.6 (seed 0) with every mode, then 16,000
# tokens greedy and at 0.6 with `ar`, `draft`, `triforce` and auto (MODES_16K); two turns per mode (medians
# in the table), the prompt prefilled once per run and restored by every mode (--prefix-cache-gb), one
# fresh calibration per label shared by its runs in order. Resumable; from the repository root:
#   PATH=$PWD/.venv/bin:$PATH bash benchmarks/results/issue12/zen4_qwen/run.sh LABEL
# Table: python benchmarks/auto_table.py benchmarks/results/issue12/zen4_qwen/LABEL/qwen_*.json
set -e
label=${1:?usage: run.sh LABEL}
source benchmarks/resumable_bench.sh
labelled_runs benchmarks/results/issue12/zen4_qwen zen4_qwen $label
common="--model qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --text $text --max-new-tokens 128 --repeats 2 --prefix-cache-gb 1.5"
modes=${MODES:-ar draft retrieval triforce auto}
TRIFORCE_HOME=$home resumable qwen_greedy_7936 --lengths 7936 --temperatures 0 --modes $modes
TRIFORCE_HOME=$home resumable qwen_sampled_7936_seed0 --lengths 7936 --temperatures 0.6 --seed 0 --modes $modes
TRIFORCE_HOME=$home resumable qwen_greedy_16000 --lengths 16000 --temperatures 0 --modes ${MODES_16K:-ar draft triforce auto}
TRIFORCE_HOME=$home resumable qwen_sampled_16000_seed0 --lengths 16000 --temperatures 0.6 --seed 0 --modes ${MODES_16K:-ar draft triforce auto}
