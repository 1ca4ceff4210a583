#!/bin/bash
# SmolLM2, a batch of four 8K prompts from the novels, 0.6, 128 new tokens: `ar` and auto, two turns each,
# each seed from a27c558 (each stretch moved a mode's speed factor halfway) and then f10ea27 (pooled)
# (benchmarks/resumable_bench.sh `alternating`; the sides' calibration was copied from the one that
# benchmarks/results/issue12/smollm2_batches/run.sh made for ../f10ea27.json). 2-core AMD EPYC Zen 4,
# 2026-12-04. From the repository root:
#   bash benchmarks/results/issue12/zen4_batches/ab_realized/run.sh OLD_CHECKOUT NEW_CHECKOUT "0 1 2"
#   python benchmarks/seed_means.py benchmarks/results/issue12/zen4_batches/ab_realized/*.json --against ar
set -e
source benchmarks/resumable_bench.sh
alternating "$1" "$2" "$(cd "$(dirname "$0")" && pwd)" b4_t06 "$3" --text "$PWD"/../shared/data/austen-*.txt \
  --max-new-tokens 128 --lengths 7936 --batch 4 --temperatures 0.6 --modes ar auto --prefix-cache-gb 3 --repeats 2
