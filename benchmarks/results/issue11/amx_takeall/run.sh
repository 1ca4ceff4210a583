#!/bin/bash
# Issue 11's tree1 sweep in `triforce` mode after the target's check takes all of tier 2's tree rounds and
# children are drawn by inverse CDF. Greedy: one bench with repeats (the output does not depend on the
# seed). Temperatures 0.6 and 1.0: one bench per seed, since a single sample path decides acceptance there
# (the same tree ran 0.83x to 1.38x the chain on different seeds). Resumable: a finished file is kept.
# Run from the repository root: bash benchmarks/results/issue11/amx_takeall/run.sh
# The files here came from the code of ba5274b. To rerun them as they were, run this script (it needs
# benchmarks/resumable_bench.sh, newer than some of them) with that code first on the path:
#   git worktree add /tmp/tf-ba5274b ba5274b && PYTHONPATH=/tmp/tf-ba5274b bash benchmarks/results/issue11/amx_takeall/run.sh
set -e
out=benchmarks/results/issue11/amx_takeall
text=${TEXT:-../shared/data/austen-emma.txt}
common="--text $text --lengths 7936 --max-new-tokens 256 --modes ar triforce"
source benchmarks/resumable_bench.sh
resumable greedy --temperatures 0 --sweep tree1=0,4,8,12,auto --repeats 2
for seed in 0 1 2 3 4 5; do
  resumable sampled_seed$seed --temperatures 0.6 1.0 --sweep tree1=0,4,8,12 --seed $seed
done
# The same greedy sweep with the kernels at the avx512 level (vector units only, no AMX tiles: the path of
# an AVX512-BF16 CPU such as Zen 4) and at the avx2 level (every x86-64 CPU of the last decade).
TRIFORCE_CPU_ISA=avx512 resumable greedy_avx512 --temperatures 0 --sweep tree1=0,4,8 --repeats 2
TRIFORCE_CPU_ISA=avx2 resumable greedy_avx2 --temperatures 0 --sweep tree1=0,4,8 --repeats 2
# Longer chains instead of trees (gamma1, the draft's chain per tier-2 check; tree1 = 0), for comparison.
resumable greedy_chains --temperatures 0 --sweep gamma1=2,4,8 --repeats 2
