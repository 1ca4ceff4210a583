#!/bin/bash
# The Qwen2.5-Coder pair at 32,000 tokens of Emma alone on the 2-core Zen 4 (greedy, 128 new tokens, `ar`,
# `draft` and auto; the prompt prefilled once and restored by every mode): the AVX2 EPYC's qwen_long.sh
# with RUNS=long, into this folder. Resumable; from the repository root:
#   PATH=$PWD/.venv/bin:$PATH bash benchmarks/results/issue12/zen4_qwen/long.sh LABEL
# Table: python benchmarks/auto_table.py benchmarks/results/issue12/zen4_qwen/LABEL/qwen_greedy_32000.json
OUT=benchmarks/results/issue12/zen4_qwen RUNS=long PREFIX_CACHE_GB=${PREFIX_CACHE_GB:-1.5} \
  exec bash benchmarks/results/issue12/avx2_epyc/qwen_long.sh "$@"
