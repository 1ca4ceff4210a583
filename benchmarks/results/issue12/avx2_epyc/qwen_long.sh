#!/bin/bash
# The Qwen2.5-Coder pair on the AVX2-only EPYC where qwen.sh stops: a batch of four 7,936-token prompts cut
# from different novels (greedy, 128 new tokens each), then 32,000 tokens of Emma alone (greedy), each in
# `ar`, `draft` and auto (the modes that led at 8K and 16K here; `retrieval` and `triforce` ran 0.66x and
# 0.74x `ar` at 8K, and cost most of an hour more at 32K). One fresh calibration per label, shared by its
# runs in order. Models from TRIFORCE_HOME (`triforce fetch-model qwen2.5-coder-1.5b`, `qwen2.5-coder-0.5b`).
# RUNS: which of the two (default "batch4 long"); PREFIX_CACHE_GB: bench --prefix-cache-gb (the prompts are
# prefilled once and every mode restores them; 32K of Qwen's KV is 0.92 GB, four 8K prompts' 0.92 GB too).
# OUT: another results folder (a CPU's own). Results in OUT/LABEL/qwen_*; resumable:
#   TRIFORCE_HOME=... PATH=$PWD/.venv/bin:$PATH bash benchmarks/results/issue12/avx2_epyc/qwen_long.sh LABEL
# Tables: python benchmarks/auto_table.py OUT/LABEL/qwen_*.json (OUT: benchmarks/results/issue12/avx2_epyc)
set -e
label=${1:?usage: qwen_long.sh LABEL}
source benchmarks/resumable_bench.sh
labelled_runs ${OUT:-benchmarks/results/issue12/avx2_epyc} avx2_epyc_qwen $label
common="--model qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --max-new-tokens 128 --temperatures 0
  --prefix-cache-gb ${PREFIX_CACHE_GB:-0}"
modes=${MODES:-ar draft auto}
runs=${RUNS:-batch4 long}
if [[ $runs == *batch4* ]]; then
  TRIFORCE_HOME=$home resumable qwen_greedy_7936_batch4 --text ${NOVELS:-../shared/data/austen-*.txt} --lengths 7936 \
    --batch 4 --modes $modes
fi
if [[ $runs == *long* ]]; then
  TRIFORCE_HOME=$home resumable qwen_greedy_32000 --text $text --lengths 32000 --modes $modes
fi
