#!/bin/bash
# Drafts in turns at 8 x 7,936 tokens of Emma (held out of every draft's training): `triforce bench`,
# greedy and at 0.6, modes ar, draft and triforce. Run from the repository root:
#   TURNS=2 bash benchmarks/results/issue12/amx16/onpolicy/run.sh shipped=triforce/drafts/smollm2 onpolicy=DIR ...
# (this session: shipped and onpolicy, the continuations-only draft, two turns; then mix=DIR, one turn)
set -e
here=benchmarks/results/issue12/amx16/onpolicy
for turn in $(seq 1 "${TURNS:-2}"); do
  for pair in "$@"; do
    name=${pair%%=*}; draft=${pair#*=}
    .venv/bin/triforce bench --text ../shared/data/austen-emma.txt --lengths 7936 --batch 8 --temperatures 0 0.6 \
      --max-new-tokens 128 --modes ar draft triforce --repeats 1 --prefix-cache-gb 4 --draft "$draft" \
      --out "$here/bench_${name}_turn${turn}.json" > /dev/null
  done
done
