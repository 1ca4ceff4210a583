#!/bin/bash
# Mode auto against draft at 4K of Emma and 0.6, each seed from 7775d65 and then eb5a540 (the lookup's
# per-round evidence, speed factors not pooled across batch changes: a review's fixes), each side's
# TRIFORCE_HOME copied from one calibration (benchmarks/resumable_bench.sh `alternating`). 2-core AMD EPYC
# Zen 4, 2026-12-04. From the repository root:
#   bash benchmarks/results/issue12/zen4_grid/review_fixes/run.sh OLD_CHECKOUT NEW_CHECKOUT "0 1 2 3 4 5 6 7"
#   python benchmarks/seed_means.py benchmarks/results/issue12/zen4_grid/review_fixes/*.json --against draft
set -e
source benchmarks/resumable_bench.sh
alternating "$1" "$2" "$(cd "$(dirname "$0")" && pwd)" t06_4k "$3" --text "$PWD/../shared/data/austen-emma.txt" \
  --lengths 4096 --temperatures 0.6 --max-new-tokens 256 --modes draft auto --prefix-cache-gb 2
