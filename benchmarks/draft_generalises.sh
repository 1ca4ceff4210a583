#!/usr/bin/env bash
# Issue 14's targets: how a tier-1 draft does on prose it never saw. For each draft folder given, on the
# first 7,936 tokens of Emma (Austen, held out of training) and of KJV Genesis (not Austen; made by
# benchmarks/texts/make_kjv_genesis.sh), SmolLM2 bfloat16, 256 new tokens, greedy and temperature 0.6:
# `ar`, `draft` and `triforce` tokens/s and each tier's acceptance. The drafts take turns per text.
#   benchmarks/draft_generalises.sh OUT_DIR DRAFT_DIR...   (a draft folder's name labels its results)
# BENCH_ARGS adds flags to every bench (for example BENCH_ARGS="--sweep lookup=0,3": prompt lookup off and on).
set -euo pipefail
OUT=$1; shift
TRIFORCE=${TRIFORCE:-triforce}
mkdir -p "$OUT"
for text in ../shared/data/austen-emma.txt benchmarks/texts/kjv-genesis.txt; do
    for draft in "$@"; do
        name=$(basename "$text" .txt)-$(basename "$draft")
        $TRIFORCE bench --text "$text" --draft "$draft" --lengths 7936 --max-new-tokens 256 \
            --temperatures 0 0.6 --modes ar draft triforce ${BENCH_ARGS:-} --out "$OUT/$name.json"
    done
done
