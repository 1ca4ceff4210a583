#!/bin/bash
# A/B of badb4ed (bfloat16 rows past the linear kernel's one call take it in pieces at the avx512 level too)
# against its parent 452720f: SmolLM2 in batches of 4 and 8, 2,048-token prompts from the six novels, 128
# new tokens, greedy, modes ar retrieval triforce, two turns ("seeds" 0 and 1: the same text), each run by
# the old checkout and then the new (benchmarks/resumable_bench.sh: alternating).
#   git worktree add --detach /tmp/wt_old 452720f; git worktree add --detach /tmp/wt_new badb4ed
#   PATH=$PWD/.venv/bin:$PATH bash benchmarks/results/linear_rows/pieces_ab.sh /tmp/wt_old /tmp/wt_new
# Table: python benchmarks/seed_means.py benchmarks/results/linear_rows/pieces_ab/*.json
set -e
old=${1:?old checkout} new=${2:?new checkout}
folder=$PWD/benchmarks/results/linear_rows/pieces_ab
mkdir -p "$folder"
source benchmarks/resumable_bench.sh
alternating "$old" "$new" "$folder" b48 "0 1" --text $PWD/../shared/data/austen-*.txt --lengths 2048 \
  --max-new-tokens 128 --prefix-cache-gb 1 --batch 4 8 --modes ar retrieval triforce --temperatures 0
