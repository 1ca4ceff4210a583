#!/bin/bash
# Does a bigger retrieval budget let `triforce` pass `draft` at 32K and 16K (SmolLM2 + yarn:4, Emma, batch
# 1, 256 new tokens)? Budget 2048 / 4096 / 8192 for `triforce` (`draft` runs once per value: it ignores the
# budget, so its three runs show the run-to-run spread), greedy and 0.6 seed 0. Resumable; run from the
# repository root, the code under test first on PYTHONPATH; table by
#   python benchmarks/tree_seeds.py benchmarks/results/issue12/yarn_amx/budget_*.json
set -e
out=benchmarks/results/issue12/yarn_amx
text=${TEXT:-../shared/data/austen-emma.txt}
common="--text $text --max-new-tokens 256 --rope-scaling yarn:4 --modes ar draft triforce"
source benchmarks/resumable_bench.sh
for length in 32000 16000; do  # 32K ran first; 16K was added after, with the same code (85af597)
  resumable budget_greedy_$length --lengths $length --temperatures 0 --sweep budget=2048,4096,8192
  resumable budget_sampled_${length}_seed0 --lengths $length --temperatures 0.6 --seed 0 --sweep budget=2048,4096,8192
done
