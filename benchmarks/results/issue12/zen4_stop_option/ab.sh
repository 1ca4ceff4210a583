#!/bin/bash
# The stop as a scored option (f1f1be7) against the rule on the checks' shape before it (41b4aa4), on the
# Zen 4: SmolLM2 batches of 2 and 4 (8K prompts from the six novels, greedy and 0.6, every mode) and the
# 2K/4K/8K single-sequence grid of Emma; each side its own TRIFORCE_HOME (priors apart), both on one cost
# table (the first side's measurement copied into the second's home). Run from the repository root with
# worktrees of both commits at /tmp/old and /tmp/new and .venv/bin on PATH:
#   bash benchmarks/results/issue12/zen4_stop_option/ab.sh
# Tables: python benchmarks/auto_table.py benchmarks/results/issue12/zen4_stop_option/*.json
set -e
out=benchmarks/results/issue12/zen4_stop_option
source benchmarks/resumable_bench.sh
for side in old new; do calibration_home /tmp/triforce_home_stop_option_$side; mkdir -p /tmp/triforce_home_stop_option_$side/calibration; done
copy_costs() { cp /tmp/triforce_home_stop_option_$1/calibration/costs-3.json /tmp/triforce_home_stop_option_$2/calibration/; }
run() {  # SIDE NAME ARGS...
  local side=$1 name=$2; shift 2
  PYTHONPATH=/tmp/$side TRIFORCE_HOME=/tmp/triforce_home_stop_option_$side resumable ${side}_$name "$@"
}
common="--max-new-tokens 128 --lengths 7936 --text ../shared/data/austen-*.txt"
batches="--batch 2 4 --temperatures 0 0.6 --modes ar draft retrieval triforce auto --prefix-cache-gb 3 --repeats 2"
run old batches $batches
copy_costs old new
run new batches $batches
common="--text ../shared/data/austen-emma.txt --max-new-tokens 256"
grid="--lengths 2048 4096 7936 --temperatures 0 0.6 --modes ar draft retrieval triforce auto --repeats 2 --prefix-cache-gb 2"
run new grid $grid
copy_costs new old
run old grid $grid
