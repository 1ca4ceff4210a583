#!/bin/bash
# The planner pricing a batch's wait for its slowest sequence (new: 07d1925, speed_model._batch_round) against
# a sequence's own mean wait (old: a8c89d7) over seeds at 0.6 in batches of 8K prompts, taking turns
# (benchmarks/resumable_bench.sh: alternating), each side its own home. Alone the two plan alike (the
# model is the same at batch 1), so only batches are run.
# Run from the repository root with worktrees at /tmp/old and /tmp/new and .venv/bin on PATH:
#   bash benchmarks/results/issue12/zen4_batch_wait/seeds.sh
# (BATCH_SEEDS: other seeds; BATCHES: other batch sizes; TEMPERATURE: another temperature.)
# Tables: python benchmarks/seed_means.py benchmarks/results/issue12/zen4_batch_wait/seeds/*_batch_*.json --against best
set -e
folder=$PWD/benchmarks/results/issue12/zen4_batch_wait/seeds
mkdir -p "$folder"
source benchmarks/resumable_bench.sh
alternating /tmp/old /tmp/new "$folder" batch "${BATCH_SEEDS:-0 1 2 3 4 5 6}" --text $PWD/../shared/data/austen-*.txt --lengths 7936 --batch ${BATCHES:-2 4} \
  --temperatures ${TEMPERATURE:-0.6} --max-new-tokens 128 --modes draft retrieval auto --prefix-cache-gb 3
