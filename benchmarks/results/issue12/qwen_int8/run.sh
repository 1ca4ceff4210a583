#!/bin/bash
# The Qwen2.5-Coder pair (1.5B target, 0.5B draft: `triforce fetch-model`) at 16K of Emma with the default
# proposer weights (auto: on the 2-core Zen 4 both tiers run their int8 twins, docs/speed.md), every mode,
# greedy and 0.6 (seed 0), 64 new tokens, one bench: the prompt prefilled once and its KV kept for the
# runs after it (--prefix-cache-gb 1). One fresh calibration per label. Resumable; run from the repository
# root with the code under test on PYTHONPATH:
#   PYTHONPATH=$PWD bash benchmarks/results/issue12/qwen_int8/run.sh LABEL
# Table: python benchmarks/auto_table.py benchmarks/results/issue12/qwen_int8/LABEL/*.json
set -e
label=${1:?usage: run.sh LABEL}
source benchmarks/resumable_bench.sh
labelled_runs benchmarks/results/issue12/qwen_int8 qwen_int8 $label
common="--model qwen2.5-coder-1.5b --text $text --max-new-tokens 64 --prefix-cache-gb 1"
TRIFORCE_HOME=$home resumable l16000 --lengths 16000 --modes ar draft retrieval triforce auto --temperatures 0 0.6
