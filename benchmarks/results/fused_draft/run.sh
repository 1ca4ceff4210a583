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
# Then `draft` mode alone at 2K greedy, three turns of two repeats each (draft2k_*.json), and the step
# itself, fused against the layer loop in one process: python benchmarks/draft_step.py > draft_step.json
for turn in 1 2 3; do
  for commit in "$base" "$new"; do
    PYTHONPATH="/tmp/wt_$commit" .venv/bin/python -m triforce bench --text "$text" --lengths 2048 \
      --temperatures 0 --max-new-tokens 256 --modes ar draft --repeats 2 \
      --out "$out/draft2k_${commit}_turn$turn.json" > /dev/null 2>&1
  done
done
