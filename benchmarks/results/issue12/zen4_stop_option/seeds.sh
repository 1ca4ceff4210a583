#!/bin/bash
# The stop as a scored option (new: f1f1be7, or 928d3ed; reverted since) against the rule (old: 41b4aa4) over
# seeds, taking turns (benchmarks/resumable_bench.sh: alternating): one run per seed says little at 0.6,
# where each seed samples another text (single seeds ranged 0.68-1.37x auto / draft). Run from the
# repository root with worktrees at /tmp/old and /tmp/new and .venv/bin on PATH:
#   bash benchmarks/results/issue12/zen4_stop_option/seeds.sh
# (SINGLE_SEEDS, BATCH_SEEDS: other seeds; the second run, 928d3ed and later against 41b4aa4, took 6-11 and 4-6.)
# Tables: python benchmarks/seed_means.py benchmarks/results/issue12/zen4_stop_option/seeds/*_single_*.json
set -e
folder=$PWD/benchmarks/results/issue12/zen4_stop_option/seeds
mkdir -p "$folder"
source benchmarks/resumable_bench.sh
alternating /tmp/old /tmp/new "$folder" single "${SINGLE_SEEDS:-0 1 2 3 4 5}" --text $PWD/../shared/data/austen-emma.txt --lengths 4096 7936 \
  --temperatures 0.6 --max-new-tokens 256 --modes draft auto --prefix-cache-gb 2
alternating /tmp/old /tmp/new "$folder" batch "${BATCH_SEEDS:-0 1 2 3}" --text $PWD/../shared/data/austen-*.txt --lengths 7936 --batch 2 4 \
  --temperatures 0.6 --max-new-tokens 128 --modes draft retrieval auto --prefix-cache-gb 3
