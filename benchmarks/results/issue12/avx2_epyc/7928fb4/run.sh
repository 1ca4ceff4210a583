#!/bin/bash
# SmolLM2 + yarn:4 at 32,000 tokens of Emma, greedy, on the AVX2 EPYC, at 7928fb4 (an idle draft watched only
# while it can pay): does the gate still watch a small draft beside a long context? `ar` then `draft` and
# auto restoring the prompt's KV that `ar` kept; a fresh calibration home (models linked from the usual one):
source benchmarks/resumable_bench.sh; calibration_home /tmp/th_yarn_7928fb4
TRIFORCE_HOME=/tmp/th_yarn_7928fb4 PATH=$PWD/.venv/bin:$PATH triforce bench --text ../shared/data/austen-emma.txt \
  --max-new-tokens 256 --rope-scaling yarn:4 --lengths 32000 --temperatures 0 --modes ar draft auto \
  --prefix-cache-gb 1 --out benchmarks/results/issue12/avx2_epyc/7928fb4/yarn_greedy_32000.json
