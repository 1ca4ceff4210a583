#!/bin/bash
# SmolLM2, a batch of four 8K prompts from the novels, 0.6, 128 new tokens: `ar` and auto, two turns each,
# per seed, alternating between a27c558 (each stretch moved a mode's speed factor halfway) and f10ea27
# (pooled), each with its own TRIFORCE_HOME copied from one calibration (the one
# benchmarks/results/issue12/smollm2_batches/run.sh made for ../f10ea27.json).
#   bash run.sh OLD_CHECKOUT NEW_CHECKOUT SEED...     2-core AMD EPYC Zen 4, 2026-12-04
# Table: python benchmarks/seed_means.py *_seed*.json --against ar
set -e
old=$1 new=$2; shift 2
here=$(cd "$(dirname "$0")" && pwd)
for s in "$@"; do
  for side in old new; do
    dir=${!side}; label=$(git -C "$dir" rev-parse --short HEAD)
    (cd "$dir" && TRIFORCE_HOME=/tmp/triforce_home_batch_$side PYTHONPATH=$dir python -m triforce bench \
      --text ../shared/data/austen-*.txt --max-new-tokens 128 --lengths 7936 --batch 4 --temperatures 0.6 \
      --modes ar auto --prefix-cache-gb 3 --repeats 2 --seed $s --out "$here/${label}_b4_t06_seed$s.json")
  done
done
