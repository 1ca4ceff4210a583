#!/bin/bash
# qwen_long.sh's first point alone, cheaper: the Qwen2.5-Coder pair in a batch of four 7,936-token prompts
# cut from different novels (greedy, 128 new tokens each), `ar` then auto, where auto restores the four
# prompts' target KV that `ar` kept (--prefix-cache-gb 2: 0.9 GB) instead of prefilling them again (17
# minutes on this CPU; decoding is the same, its prefill_s is the restore and the draft's window). A fresh
# calibration per label, as in qwen_long.sh; REPEATS=R runs each mode R times, taking turns. Models from
# TRIFORCE_HOME; resumable:
#   TRIFORCE_HOME=... PATH=$PWD/.venv/bin:$PATH bash benchmarks/results/issue12/avx2_epyc/qwen_batch4.sh LABEL
set -e
label=${1:?usage: qwen_batch4.sh LABEL}
source benchmarks/resumable_bench.sh
labelled_runs benchmarks/results/issue12/avx2_epyc avx2_epyc_qwen $label
common="--model qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --max-new-tokens 128 --temperatures 0"
TRIFORCE_HOME=$home resumable qwen_greedy_7936_batch4 --text ${NOVELS:-../shared/data/austen-*.txt} --lengths 7936 \
  --batch 4 --modes ${MODES:-ar auto} --prefix-cache-gb 2 --repeats ${REPEATS:-1}
