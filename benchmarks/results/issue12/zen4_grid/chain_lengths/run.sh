#!/bin/bash
# Mode auto against draft at 4K and 8K of Emma and 0.6, each seed from OLD (8a8e982) and then NEW (the speed
# model with chains that stop_below ends early), each side's TRIFORCE_HOME holding the usual calibration's
# costs and no priors (the two sides' priors files differ: priors-4 / priors-5), so both learn theirs over
# the seeds alike (benchmarks/resumable_bench.sh `alternating`). 2-core AMD EPYC Zen 4, 2026-12-04. From the
# repository root, with .venv/bin on PATH (NEW ran as 1bcd647, this change's code before its rebase; files
# are named by each checkout's commit). greedy/ holds the same with --temperatures 0 and seeds "0 1" (two
# turns), why/ the output of benchmarks/auto_why.py --stretches from each checkout (docs/auto.md):
#   bash benchmarks/results/issue12/zen4_grid/chain_lengths/run.sh OLD_CHECKOUT NEW_CHECKOUT "0 1 2 3 4 5 6 7"
#   python benchmarks/seed_means.py benchmarks/results/issue12/zen4_grid/chain_lengths/*.json --against draft
set -e
source benchmarks/resumable_bench.sh
for side in old new; do
  home=/tmp/triforce_home_chain_lengths_$side
  if [ ! -d "$home" ]; then
    calibration_home "$home" && mkdir "$home/calibration"
    cp "${TRIFORCE_HOME:-$HOME/.cache/triforce}"/calibration/costs-*.json "$home/calibration/"
  fi
done
alternating "$1" "$2" "$(cd "$(dirname "$0")" && pwd)" chain_lengths "$3" --text "$PWD/../shared/data/austen-emma.txt" \
  --lengths 4096 7936 --temperatures 0.6 --max-new-tokens 256 --modes draft auto --prefix-cache-gb 2
