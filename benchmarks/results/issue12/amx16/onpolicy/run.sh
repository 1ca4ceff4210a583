#!/bin/bash
# The shipped draft against one trained on from it on the target's continuations (train-draft --init
# --continuations), in turns, at 8 x 7,936 tokens of Emma (held out of both drafts' training): `triforce
# bench`, greedy and at 0.6, modes ar, draft and triforce. Run from the repository root:
#   bash benchmarks/results/issue12/amx16/onpolicy/run.sh NEW_DRAFT [TURNS]
set -e
new=$1; turns=${2:-2}; here=benchmarks/results/issue12/amx16/onpolicy
for turn in $(seq 1 "$turns"); do
  for name in shipped onpolicy; do
    draft=triforce/drafts/smollm2; [ "$name" = onpolicy ] && draft=$new
    .venv/bin/triforce bench --text ../shared/data/austen-emma.txt --lengths 7936 --batch 8 --temperatures 0 0.6 \
      --max-new-tokens 128 --modes ar draft triforce --repeats 1 --prefix-cache-gb 4 --draft "$draft" \
      --out "$here/bench_${name}_turn${turn}.json" > /dev/null
  done
done
