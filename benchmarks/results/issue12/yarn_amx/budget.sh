#!/bin/bash
# Does a bigger retrieval budget let `triforce` pass `draft` at 32K (SmolLM2 + yarn:4, Emma, batch 1, 256
# new tokens)? Budget 2048 / 4096 / 8192 for `triforce` (`draft` runs once per value: it ignores the
# budget, so its three runs show the run-to-run spread), greedy and 0.6 seed 0. Resumable; run from the
# repository root, the code under test first on PYTHONPATH; table by
#   python benchmarks/tree_seeds.py benchmarks/results/issue12/yarn_amx/budget_*.json
set -e
out=benchmarks/results/issue12/yarn_amx
text=${TEXT:-../shared/data/austen-emma.txt}
common="--text $text --max-new-tokens 256 --rope-scaling yarn:4 --lengths 32000 --modes ar draft triforce"
source benchmarks/resumable_bench.sh
resumable budget_greedy_32000 --temperatures 0 --sweep budget=2048,4096,8192
resumable budget_sampled_32000_seed0 --temperatures 0.6 --seed 0 --sweep budget=2048,4096,8192
