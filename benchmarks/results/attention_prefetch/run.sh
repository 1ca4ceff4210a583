#!/bin/bash
# The attention kernels' trickled prefetch (bdddae6) against the commit before it (92cbc05), end to end:
# each seed's bench from the old checkout, then the new (benchmarks/resumable_bench.sh `alternating`).
# 2-core AMD EPYC Zen 4 (avx512 kernels), 2026-12-05. From the repository root, the venv's bin/ on PATH:
#   git worktree add /tmp/wt_old 92cbc05; git worktree add /tmp/wt_new bdddae6
#   bash benchmarks/results/attention_prefetch/run.sh /tmp/wt_old /tmp/wt_new
#   python benchmarks/results/attention_prefetch/table.py benchmarks/results/attention_prefetch/*.json
set -e
source benchmarks/resumable_bench.sh
here="$(cd "$(dirname "$0")" && pwd)"
text="$PWD/../shared/data/austen-emma.txt"
alternating "$1" "$2" "$here" 8k "0 1" --text "$text" --lengths 7936 --temperatures 0 0.6 \
  --max-new-tokens 256 --modes ar draft retrieval triforce --prefix-cache-gb 2
alternating "$1" "$2" "$here" yarn16k "0" --text "$text" --lengths 16000 --temperatures 0 0.6 \
  --max-new-tokens 128 --rope-scaling yarn:4 --modes ar draft triforce --prefix-cache-gb 2
