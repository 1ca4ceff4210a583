#!/bin/bash
# Mode auto against the fixed modes on an AVX2-only CPU (a 2-core AMD EPYC, family 25 model 1: AVX2 + FMA,
# no AVX-512, so the kernels run at the avx2 level without forcing it), 2K, 4K and 8K of Emma, batch 1,
# 256 new tokens: greedy once, 0.6 over seeds 0-2 (one bench per seed), one fresh calibration per label
# shared by its runs in order. Results in $out/LABEL (the code's commit). Resumable: a finished file is
# kept. Run from the repository root with the venv's bin on PATH:
#   PATH=$PWD/.venv/bin:$PATH bash benchmarks/results/issue12/avx2_epyc/run.sh LABEL
# Tables: python benchmarks/auto_table.py benchmarks/results/issue12/avx2_epyc/LABEL/*.json;
#         python benchmarks/seed_means.py benchmarks/results/issue12/avx2_epyc/LABEL/l7936*.json --against best
set -e
label=${1:?usage: run.sh LABEL}
source benchmarks/resumable_bench.sh
labelled_runs benchmarks/results/issue12/avx2_epyc avx2_epyc $label
common="--text $text --max-new-tokens 256 --modes ${MODES:-ar draft retrieval triforce auto}"
for length in ${LENGTHS:-7936 4096 2048}; do
  TRIFORCE_HOME=$home resumable greedy_${length} --lengths $length --temperatures 0
  for seed in ${SEEDS:-0 1 2}; do
    TRIFORCE_HOME=$home resumable l${length}_sampled_seed$seed --lengths $length --temperatures 0.6 --seed $seed
  done
done
