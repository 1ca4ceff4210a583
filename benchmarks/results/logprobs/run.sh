#!/bin/bash
# What log-probabilities cost, and whether the engine change costs anything without them (SmolLM2,
# bfloat16, 2,048 tokens of Emma, 128 new tokens). Usage: bash run.sh BEFORE_COMMIT AFTER_COMMIT, from the
# repository root with its .venv; worktrees in /tmp, results beside this script.
set -e
here=$(dirname "$0")
for c in "$1" "$2"; do git worktree add -f /tmp/tf-$c $c >/dev/null 2>&1 || true; done
B="--text ../shared/data/austen-emma.txt --lengths 2048 --temperatures 0 0.6 --max-new-tokens 128 --modes ar triforce --repeats 2"
for turn in 1 2; do
  for c in "$1" "$2"; do
    PYTHONPATH=/tmp/tf-$c .venv/bin/python -m triforce bench $B --out $here/bench_${c}_turn$turn.json
  done
done
PYTHONPATH=/tmp/tf-$2 .venv/bin/python /tmp/tf-$2/benchmarks/logprobs_cost.py --text ../shared/data/austen-emma.txt \
    --repeats 5 > $here/logprobs_cost_$2.json
