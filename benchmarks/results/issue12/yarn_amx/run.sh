#!/bin/bash
# SmolLM2 + yarn:4 at 16K and 32K of Emma, batch 1, 256 new tokens, every mode (issue 12's long-context
# points, which the grid's auto bar covers too): greedy once, 0.6 over seeds 0-2 (one bench per seed), one
# fresh calibration per label shared by its runs in order. Results in $out/LABEL (the code's commit:
# run with that code first on PYTHONPATH); MODES overrides the modes. Resumable: a finished file is
# kept. Run from the repository root, e.g.
#   git worktree add /tmp/tf-02cc146 02cc146
#   MODES="ar draft triforce auto" PYTHONPATH=/tmp/tf-02cc146 bash benchmarks/results/issue12/yarn_amx/run.sh 02cc146
# Tables: python benchmarks/auto_table.py benchmarks/results/issue12/yarn_amx/LABEL/*.json;
#         python benchmarks/seed_means.py benchmarks/results/issue12/yarn_amx/LABEL/l32000*.json --against best
set -e
label=${1:?usage: run.sh LABEL}
source benchmarks/resumable_bench.sh
labelled_runs benchmarks/results/issue12/yarn_amx yarn_amx $label
common="--text $text --max-new-tokens 256 --rope-scaling yarn:4 --modes ${MODES:-ar draft retrieval triforce auto}"
for length in 16000 32000; do
  TRIFORCE_HOME=$home resumable greedy_${length} --lengths $length --temperatures 0
  for seed in 0 1 2; do
    TRIFORCE_HOME=$home resumable l${length}_sampled_seed$seed --lengths $length --temperatures 0.6 --seed $seed
  done
done
