#!/bin/bash
# Mode auto against draft at 0.6 (4K and 8K of Emma), seeds interleaved between two checkouts, each with
# its own TRIFORCE_HOME (models linked, calibration copied from one state, so that neither's priors leak
# into the other's): a27c558 (each stretch moved a mode's speed factor halfway) and f10ea27 (pooled).
#   bash run.sh OLD_CHECKOUT NEW_CHECKOUT SEED...      then: python benchmarks/seed_means.py *_seed*.json --against draft
# 2-core AMD EPYC Zen 4 (avx512 kernels), 2026-12-04.
set -e
old=$1 new=$2; shift 2
here=$(cd "$(dirname "$0")" && pwd)
for s in "$@"; do
  for side in old new; do
    dir=${!side}; label=$(git -C "$dir" rev-parse --short HEAD)
    home=/tmp/triforce_home_$side
    if [ ! -d $home ]; then
      mkdir -p $home && ln -s ~/.cache/triforce/models $home/models && cp -r ~/.cache/triforce/calibration $home/
    fi
    (cd "$dir" && TRIFORCE_HOME=$home PYTHONPATH=$dir python -m triforce bench --text ../shared/data/austen-emma.txt \
      --lengths 4096 7936 --temperatures 0.6 --max-new-tokens 256 --modes draft auto --prefix-cache-gb 2 \
      --seed $s --out "$here/${label}_t06_seed$s.json")
  done
done
# Then, at f10ea27 alone (the new side's TRIFORCE_HOME, after the runs above), the 8K point with `triforce` too:
#   for s in 0 1 2 3 4 5 6 7; do python -m triforce bench --text ../shared/data/austen-emma.txt --lengths 7936 \
#     --temperatures 0.6 --max-new-tokens 256 --modes draft triforce auto --prefix-cache-gb 2 --seed $s \
#     --out f10ea27_8k_three_seed$s.json; done
#   python benchmarks/seed_means.py f10ea27_8k_three_seed*.json --against best
