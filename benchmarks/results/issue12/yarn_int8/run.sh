#!/bin/bash
# Do the int8 proposers (the default weights since c816897: the twin where a forward of it is timed faster)
# lift `triforce` to issue 12's bar past the model's positions (>= 2x `ar` at 16K and 32K)? SmolLM2 + yarn:4,
# Emma, batch 1, 128 new tokens, the budget a quarter of the context (4096 at 16K, 8192 at 32K: what paid
# best on the AMX Xeon, docs/cli.md), `--sweep retrieval_weights=target,auto` in `triforce` beside `ar` and
# `draft` (which run once: they run no retrieval tier); greedy and 0.6 seed 0, one bench each, the prompt's
# KV kept for the runs after the first (--prefix-cache-gb 1.5). Then mode auto (its own budgets) against `ar`,
# each weight. One fresh calibration per label. Resumable; run from the repository root with the code under
# test on PYTHONPATH:
#   PYTHONPATH=$PWD bash benchmarks/results/issue12/yarn_int8/run.sh LABEL
# Tables: python benchmarks/results/int8_weights/table.py benchmarks/results/issue12/yarn_int8/LABEL/*.json
set -e
label=${1:?usage: run.sh LABEL}
source benchmarks/resumable_bench.sh
labelled_runs benchmarks/results/issue12/yarn_int8 yarn_int8 $label
common="--text $text --max-new-tokens 128 --rope-scaling yarn:4 --prefix-cache-gb 1.5 --sweep retrieval_weights=target,auto"
for length_budget in 16000:4096 32000:8192; do
  length=${length_budget%:*} budget=${length_budget#*:}
  fixed="--lengths $length --modes ar draft triforce --budget $budget"
  TRIFORCE_HOME=$home resumable fixed_${length}_greedy $fixed --temperatures 0
  TRIFORCE_HOME=$home resumable fixed_${length}_t06_seed0 $fixed --temperatures 0.6 --seed 0
  TRIFORCE_HOME=$home resumable auto_${length}_greedy --lengths $length --modes ar auto --temperatures 0
done
