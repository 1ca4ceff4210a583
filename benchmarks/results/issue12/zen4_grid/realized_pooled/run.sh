#!/bin/bash
# Mode auto against draft at 0.6 (4K and 8K of Emma), each seed from the old checkout and then the new one
# (benchmarks/resumable_bench.sh `alternating`): a27c558 (each stretch moved a mode's speed factor halfway)
# and f10ea27 (pooled). 2-core AMD EPYC Zen 4 (avx512 kernels), 2026-12-04. From the repository root:
#   bash benchmarks/results/issue12/zen4_grid/realized_pooled/run.sh OLD_CHECKOUT NEW_CHECKOUT "0 1 2 ... 11"
#   python benchmarks/seed_means.py benchmarks/results/issue12/zen4_grid/realized_pooled/*_t06_seed*.json --against draft
set -e
source benchmarks/resumable_bench.sh
alternating "$1" "$2" "$(cd "$(dirname "$0")" && pwd)" t06 "$3" --text "$PWD/../shared/data/austen-emma.txt" \
  --lengths 4096 7936 --temperatures 0.6 --max-new-tokens 256 --modes draft auto --prefix-cache-gb 2
# Then, at f10ea27 alone (the new side's TRIFORCE_HOME, after the runs above), the 8K point with `triforce` too:
#   for s in 0 1 2 3 4 5 6 7; do python -m triforce bench --text ../shared/data/austen-emma.txt --lengths 7936 \
#     --temperatures 0.6 --max-new-tokens 256 --modes draft triforce auto --prefix-cache-gb 2 --seed $s \
#     --out f10ea27_8k_three_seed$s.json; done
#   python benchmarks/seed_means.py f10ea27_8k_three_seed*.json --against best
