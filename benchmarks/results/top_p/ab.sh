#!/bin/bash
# top-p ranking a row's largest logits (new: 5789a5d, speculation/sampling.top_p_dropped) against a sort of
# the whole vocabulary (old: its parent), seeds taking turns (benchmarks/resumable_bench.sh: alternating),
# each side its own home: `triforce bench` at 4K of Emma, top-p 0.9, temperatures 0.6 and 1.0.
# Run from the repository root with worktrees at /tmp/old and /tmp/new and .venv/bin on PATH:
#   bash benchmarks/results/top_p/ab.sh
# Tables: python benchmarks/seed_means.py benchmarks/results/top_p/runs/*.json --against ar
set -e
folder=$PWD/benchmarks/results/top_p/runs
mkdir -p "$folder"
source benchmarks/resumable_bench.sh
alternating /tmp/old /tmp/new "$folder" topp "${SEEDS:-0 1}" --text $PWD/../shared/data/austen-emma.txt \
  --lengths 4096 --temperatures 0.6 1.0 --top-p 0.9 --max-new-tokens 128 --modes ar draft triforce auto \
  --prefix-cache-gb 1
