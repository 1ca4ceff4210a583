#!/bin/bash
# The stop kept to the draft's chains (new: 35676f2; a retrieval tier's chains run to gamma) against the stop
# on any bottom tier over steep checks (old: 9f7e238, the planner of 41b4aa4) over seeds at 0.6, taking turns
# (benchmarks/resumable_bench.sh: alternating), each side its own home; one run per seed says little at 0.6.
# Run from the repository root with worktrees at /tmp/old and /tmp/new and .venv/bin on PATH:
#   bash benchmarks/results/issue12/zen4_retrieval_no_stop/seeds.sh
# (BATCH_SEEDS, SINGLE_SEEDS: other seeds; BATCHES: other batch sizes; SINGLE_SEEDS="" skips the single runs.
# The second run, more seeds of the batch of four: BATCH_SEEDS="7 8 9 10 11 12 13" BATCHES=4 SINGLE_SEEDS="",
# the homes of the first kept.)
# Tables: python benchmarks/seed_means.py benchmarks/results/issue12/zen4_retrieval_no_stop/seeds/*_batch_*.json --against best
set -e
folder=$PWD/benchmarks/results/issue12/zen4_retrieval_no_stop/seeds
mkdir -p "$folder"
source benchmarks/resumable_bench.sh
alternating /tmp/old /tmp/new "$folder" batch "${BATCH_SEEDS:-0 1 2 3 4 5 6}" --text $PWD/../shared/data/austen-*.txt --lengths 7936 --batch ${BATCHES:-2 4} \
  --temperatures 0.6 --max-new-tokens 128 --modes draft retrieval auto --prefix-cache-gb 3
alternating /tmp/old /tmp/new "$folder" single "${SINGLE_SEEDS-0 1 2 3 4 5}" --text $PWD/../shared/data/austen-emma.txt --lengths 4096 7936 \
  --temperatures 0.6 --max-new-tokens 256 --modes draft retrieval auto --prefix-cache-gb 2
