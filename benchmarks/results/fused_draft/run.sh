#!/usr/bin/env bash
# The draft's streaming cache on the fused layer loop, before (BASE) and after (NEW): `triforce bench`
# of the modes that run the draft, two turns taking turns, from git worktrees of the two commits.
# Usage: bash benchmarks/results/fused_draft/run.sh BASE NEW   (from the repository root; Austen in ../shared)
set -eu
base=$1 new=$2 out=benchmarks/results/fused_draft
text=$(realpath ../shared/data/austen-emma.txt)
for commit in "$base" "$new"; do
  [ -d "/tmp/wt_$commit" ] || git worktree add -f "/tmp/wt_$commit" "$commit" >/dev/null
done
for turn in 1 2; do
  for commit in "$base" "$new"; do
    PYTHONPATH="/tmp/wt_$commit" .venv/bin/python -m triforce bench --text "$text" --lengths 2048 7936 \
      --temperatures 0 0.6 --max-new-tokens 256 --modes ar draft triforce auto \
      --out "$out/bench_${commit}_turn$turn.json" > "$out/bench_${commit}_turn$turn.log" 2>&1
  done
done
