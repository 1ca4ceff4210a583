#!/bin/bash
# SmolLM2 + yarn:4 past its 8,192 positions on the AVX2-only EPYC of run.sh: 16K of Emma greedy and at 0.6
# (seed 0), then 32K greedy; batch 1, 256 new tokens, budget 2048 (auto also holds 4096 and 8192). One
# fresh calibration per label shared by its runs in order; results in $out/LABEL/yarn_*; resumable.
#   PATH=$PWD/.venv/bin:$PATH bash benchmarks/results/issue12/avx2_epyc/yarn.sh LABEL
# Tables: python benchmarks/auto_table.py benchmarks/results/issue12/avx2_epyc/LABEL/yarn_*.json
set -e
label=${1:?usage: yarn.sh LABEL}
source benchmarks/resumable_bench.sh
labelled_runs benchmarks/results/issue12/avx2_epyc avx2_epyc_yarn $label
common="--text $text --max-new-tokens 256 --rope-scaling yarn:4"
TRIFORCE_HOME=$home resumable yarn_greedy_16000 --lengths 16000 --temperatures 0 --modes ${MODES:-ar draft triforce auto}
TRIFORCE_HOME=$home resumable yarn_sampled_16000_seed0 --lengths 16000 --temperatures 0.6 --seed 0 --modes ${MODES:-ar draft triforce auto}
TRIFORCE_HOME=$home resumable yarn_greedy_32000 --lengths 32000 --temperatures 0 --modes ${MODES_32K:-ar draft auto}
