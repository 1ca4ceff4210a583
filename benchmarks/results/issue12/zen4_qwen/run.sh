#!/bin/bash
# The Qwen2.5-Coder pair (1.5B target, 0.5B draft; `triforce fetch-model` both first) on the 2-core Zen 4,
# batch 1, 128 new tokens of Emma: 7,936 tokens greedy and at 0.6 (seed 0) with every mode, then 16,000
# tokens greedy and at 0.6 with `ar`, `draft`, `triforce` and auto; two turns per mode (medians in the
# table), the prompt prefilled once per run and restored by every mode (--prefix-cache-gb), one fresh
# calibration per label shared by its runs in order: the AVX2 EPYC's script with those settings.
# Resumable; from the repository root:
#   PATH=$PWD/.venv/bin:$PATH bash benchmarks/results/issue12/zen4_qwen/run.sh LABEL
# Table: python benchmarks/auto_table.py benchmarks/results/issue12/zen4_qwen/LABEL/qwen_*.json
OUT=benchmarks/results/issue12/zen4_qwen EXTRA="--repeats 2 --prefix-cache-gb 1.5" \
  MODES_16K=${MODES_16K:-ar draft triforce auto} exec bash benchmarks/results/issue12/avx2_epyc/qwen.sh "$@"
