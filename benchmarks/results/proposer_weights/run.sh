#!/usr/bin/env bash
# The default proposer weights (--retrieval-weights auto, --draft-weights auto: the int8 twin where a forward
# of it is timed faster on this machine) against the models' own, in every mode, mode auto included, in one
# session: SmolLM2 at 8K of Emma (its shipped draft's twin is not faster, so auto keeps the draft's own
# weights and the retrieval sweep is the whole difference), the same at the AVX2 level, and the Qwen2.5-Coder
# pair (`triforce fetch-model`), each tier's weights swept apart. Each group first runs untimed (mode auto
# calibrates its tiers' forward costs once per machine, and the twins' are new keys).
#   bash benchmarks/results/proposer_weights/run.sh OUT_DIR
set -euo pipefail
out=${1:?OUT_DIR}
mkdir -p "$out"
emma=../shared/data/austen-emma.txt
tf=${TRIFORCE:-triforce}
s="--text $emma --lengths 7936 --prefix-cache-gb 1 --modes ar retrieval triforce auto"
$tf bench $s --temperatures 0 0.6 --max-new-tokens 32 --sweep retrieval_weights=target,auto --out "$out/warmup_smollm2.json"
$tf bench $s --temperatures 0 --max-new-tokens 128 --sweep retrieval_weights=target,auto --repeats 2 \
  --out "$out/smollm2_greedy.json"
for seed in 0 1; do
  $tf bench $s --temperatures 0.6 --max-new-tokens 128 --sweep retrieval_weights=target,auto --seed $seed \
    --out "$out/smollm2_t06_seed$seed.json"
done
TRIFORCE_CPU_ISA=avx2 $tf bench $s --temperatures 0 --max-new-tokens 32 --sweep retrieval_weights=target,auto \
  --out "$out/warmup_smollm2_avx2.json"
TRIFORCE_CPU_ISA=avx2 $tf bench $s --temperatures 0 --max-new-tokens 128 --sweep retrieval_weights=target,auto \
  --out "$out/smollm2_avx2_greedy.json"
q="--model qwen2.5-coder-1.5b --text $emma --lengths 7936 --prefix-cache-gb 1"
$tf bench $q --modes ar retrieval draft triforce auto --temperatures 0 0.6 --max-new-tokens 16 \
  --sweep retrieval_weights=target,auto --out "$out/warmup_qwen.json"
$tf bench $q --modes ar draft triforce auto --temperatures 0 0.6 --max-new-tokens 16 --retrieval-weights target \
  --sweep draft_weights=draft,auto --out "$out/warmup_qwen_draft.json"
for t in 0 0.6; do
  $tf bench $q --modes ar retrieval triforce auto --temperatures $t --max-new-tokens 64 --draft-weights draft \
    --sweep retrieval_weights=target,auto --out "$out/qwen_retrieval_t$t.json"
  $tf bench $q --modes ar draft triforce auto --temperatures $t --max-new-tokens 64 --retrieval-weights target \
    --sweep draft_weights=draft,auto --out "$out/qwen_draft_t$t.json"
done
