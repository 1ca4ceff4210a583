#!/bin/bash
# Linear passes of up to 11 rows at the avx512 level (5473703) against the commit before (ca1f92d), end to
# end: each seed's bench from the old checkout, then the new (benchmarks/resumable_bench.sh `alternating`).
# 2-core AMD EPYC Zen 4 (avx512 kernels), 2026-12-06. From the repository root, the venv's bin/ on PATH:
#   git worktree add /tmp/wt_old ca1f92d; git worktree add /tmp/wt_new 5473703
#   bash benchmarks/results/linear_pass/run.sh /tmp/wt_old /tmp/wt_new
#   python benchmarks/results/attention_prefetch/table.py --old ca1f92d benchmarks/results/linear_pass/*.json
# The proposers' weights are pinned (the retrieval tier's int8 twin, the draft's own weights: what `auto`
# chose there on this machine, the draft near its margin): `auto` times them per checkout, and a draft
# that ran int8 on one side and its own weights on the other took other sample paths at 0.6.
set -e
source benchmarks/resumable_bench.sh
here="$(cd "$(dirname "$0")" && pwd)"
text="$PWD/../shared/data/austen-emma.txt"
alternating "$1" "$2" "$here" 8k "0 1" --text "$text" --lengths 7936 --temperatures 0 0.6 \
  --max-new-tokens 256 --modes ar draft retrieval triforce --prefix-cache-gb 2 \
  --retrieval-weights int8 --draft-weights draft
alternating "$1" "$2" "$here" trees06 "0 1 2 3" --text "$text" --lengths 7936 --temperatures 0.6 \
  --max-new-tokens 256 --modes triforce --sweep tree1=0,8,auto --prefix-cache-gb 2 \
  --retrieval-weights int8 --draft-weights draft
