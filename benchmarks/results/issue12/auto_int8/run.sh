#!/bin/bash
# Mode auto against the fixed modes at SmolLM2's headline point with the default proposer weights (auto:
# on the 2-core Zen 4 the retrieval tier runs its int8 twin, the shipped draft its own weights): 7,936
# tokens of Emma, batch 1, 128 new tokens, modes ar draft triforce auto, 0.6 over seeds 0-7 (one bench per
# seed: a sample path decides acceptance) and greedy with two repeats. One fresh calibration per label,
# shared by its runs in order (so auto's priors grow over the seeds, as a server's would). Resumable; run
# from the repository root with the code under test on PYTHONPATH:
#   PYTHONPATH=$PWD bash benchmarks/results/issue12/auto_int8/run.sh LABEL
# Tables: python benchmarks/seed_means.py benchmarks/results/issue12/auto_int8/LABEL/*seed*.json --against best
#         python benchmarks/tree_seeds.py benchmarks/results/issue12/auto_int8/LABEL/greedy.json
set -e
label=${1:?usage: run.sh LABEL}
source benchmarks/resumable_bench.sh
labelled_runs benchmarks/results/issue12/auto_int8 auto_int8 $label
common="--text $text --lengths 7936 --max-new-tokens 128 --prefix-cache-gb 1 --modes ar draft triforce auto"
TRIFORCE_HOME=$home resumable greedy --temperatures 0 --repeats 2
for seed in ${SEEDS:-0 1 2 3 4 5 6 7}; do
  TRIFORCE_HOME=$home resumable l7936_sampled_seed$seed --temperatures 0.6 --seed $seed
done
