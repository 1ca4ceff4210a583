#!/bin/bash
# The Qwen2.5-Coder pair (1.5B target, 0.5B draft) on the AVX2-only EPYC of run.sh: 7,936 tokens of Emma,
# batch 1, 128 new tokens, every mode, greedy then 0.6 (seed 0); then 16,000 tokens greedy and at 0.6
# (seed 0), `ar`, `draft` and auto (MODES_16K); one fresh calibration per label shared by its runs in
# order. The models come from TRIFORCE_HOME (`triforce fetch-model qwen2.5-coder-1.5b` and
# `qwen2.5-coder-0.5b` first). Results in $out/LABEL/qwen_* (OUT: another folder than this one's; EXTRA:
# more bench arguments for every run, as ../zen4_qwen/run.sh sets them); resumable:
#   TRIFORCE_HOME=... PATH=$PWD/.venv/bin:$PATH bash benchmarks/results/issue12/avx2_epyc/qwen.sh LABEL
# Tables: python benchmarks/auto_table.py benchmarks/results/issue12/avx2_epyc/LABEL/qwen_*.json
set -e
label=${1:?usage: qwen.sh LABEL}
source benchmarks/resumable_bench.sh
folder=${OUT:-benchmarks/results/issue12/avx2_epyc}
labelled_runs $folder "$(basename $folder)_qwen" $label
common="--model qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --text $text --max-new-tokens 128 ${EXTRA:-}"
modes=${MODES:-ar draft retrieval triforce auto}
TRIFORCE_HOME=$home resumable qwen_greedy_7936 --lengths 7936 --temperatures 0 --modes $modes
TRIFORCE_HOME=$home resumable qwen_sampled_7936_seed0 --lengths 7936 --temperatures 0.6 --seed 0 --modes $modes
TRIFORCE_HOME=$home resumable qwen_greedy_16000 --lengths 16000 --temperatures 0 --modes ${MODES_16K:-ar draft auto}
TRIFORCE_HOME=$home resumable qwen_sampled_16000_seed0 --lengths 16000 --temperatures 0.6 --seed 0 --modes ${MODES_16K:-ar draft auto}
