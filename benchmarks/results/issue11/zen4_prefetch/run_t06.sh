#!/bin/bash
# Trees against the chain in `triforce` mode at temperature 0.6, seeds 0-3 (SEEDS), each seed's three settings
# taking turns three times (--repeats 3). 2-core AMD EPYC Zen 4 (avx512 kernels), 2026-12-05: seeds 0-3 at
# 80e7969, 4-7 at 9d543c6 (the same kernels). From the repository root, the venv's bin/ on PATH:
#   SEEDS="0 1 2 3 4 5 6 7" bash benchmarks/results/issue11/zen4_prefetch/run_t06.sh
#   python benchmarks/seed_means.py benchmarks/results/issue11/zen4_prefetch/t06_seed*.json --against 'triforce tree1=0'
# OUT=<folder> writes there instead (benchmarks/results/issue11/amx5: a 2-core AMX Xeon, 2026-12-06, 9fe8351).
here="${OUT:-$(cd "$(dirname "$0")" && pwd)}"
for s in ${SEEDS:-0 1 2 3}; do
  [ -f "$here/t06_seed$s.json" ] || triforce bench --text ../shared/data/austen-emma.txt --lengths 7936 \
    --temperatures 0.6 --max-new-tokens 256 --modes triforce --sweep tree1=0,4,auto --repeats 3 \
    --prefix-cache-gb 2 --seed $s --out "$here/t06_seed$s.json" > "$here/t06_seed$s.log" 2>&1
done
