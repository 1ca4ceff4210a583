#!/usr/bin/env bash
# The int8 proposers (--retrieval-weights int8, --draft-weights int8) against the models' own weights, in one
# session: the retrieval tier's forward and the twins' agreement (benchmarks/int8_retrieval.py), then
# `triforce bench` sweeps on SmolLM2 and on the Qwen2.5-Coder pair (which `triforce fetch-model` fetches).
#   bash benchmarks/results/int8_weights/run.sh OUT_DIR
set -euo pipefail
out=${1:?OUT_DIR}
mkdir -p "$out"
emma=../shared/data/austen-emma.txt
py=${PYTHON:-python}
tf=${TRIFORCE:-triforce}
for model in smollm2 qwen2.5-coder-1.5b qwen2.5-coder-0.5b; do
  $py benchmarks/int8_retrieval.py --text $emma --model $model > "$out/forward_$model.json"
done
$tf bench --text $emma --lengths 7936 --temperatures 0 --max-new-tokens 128 --modes ar retrieval triforce \
  --sweep retrieval_weights=target,int8 --repeats 2 --prefix-cache-gb 1 --out "$out/smollm2_greedy.json"
for seed in 0 1 2; do
  $tf bench --text $emma --lengths 7936 --temperatures 0.6 --max-new-tokens 128 --modes ar retrieval triforce \
    --sweep retrieval_weights=target,int8 --seed $seed --prefix-cache-gb 1 --out "$out/smollm2_t06_seed$seed.json"
done
q="--model qwen2.5-coder-1.5b --text $emma --lengths 7936 --max-new-tokens 64 --prefix-cache-gb 1"
$tf bench $q --temperatures 0 --modes ar retrieval triforce --sweep retrieval_weights=target,int8 \
  --out "$out/qwen_retrieval_greedy.json"
$tf bench $q --temperatures 0 --modes ar draft triforce --sweep draft_weights=draft,int8 --out "$out/qwen_draft_greedy.json"
for seed in 0 1; do
  $tf bench $q --temperatures 0.6 --seed $seed --modes ar retrieval draft --sweep retrieval_weights=target,int8 \
    --out "$out/qwen_retrieval_t06_seed$seed.json"
  $tf bench $q --temperatures 0.6 --seed $seed --modes ar draft --sweep draft_weights=draft,int8 \
    --out "$out/qwen_draft_t06_seed$seed.json"
done
