#!/usr/bin/env bash
# Issue 12's items 3 and 4: --mode auto against every fixed mode, and the real pretrained pair.
# Nothing else may run meanwhile, or the ratios mean nothing. About 45 minutes on a 2-core CPU.
#   benchmarks/auto_and_pair.sh [RESULTS_DIR] [TEXT]
set -euo pipefail
OUT=${1:-benchmarks/results/issue12}
TEXT=${2:-../shared/data/austen-emma.txt}
TRIFORCE=${TRIFORCE:-triforce}
mkdir -p "$OUT"
all=(--modes ar draft retrieval triforce auto)
# 1. SmolLM2 (bfloat16, the shipped draft): auto against the best fixed mode on the single-sequence grid of docs/status.md
$TRIFORCE bench --text "$TEXT" --lengths 2048 4096 7936 --temperatures 0 0.6 --max-new-tokens 256 "${all[@]}" \
    --out "$OUT/auto_smollm2.json"
# 1b. the same at the AVX2 level (as an AVX2-only CPU runs it; issue 10's target), 4K and 8K greedy
TRIFORCE_CPU_ISA=avx2 $TRIFORCE bench --text "$TEXT" --lengths 4096 7936 --temperatures 0 --max-new-tokens 256 \
    "${all[@]}" --out "$OUT/auto_smollm2_avx2.json"
# 2. the Qwen2.5-Coder pair (1.5B target, 0.5B draft; fetched from PyPI once) at 8K, batch 1
pair=(--model qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --text "$TEXT" --max-new-tokens 128)
$TRIFORCE bench "${pair[@]}" --lengths 7936 --temperatures 0 0.6 "${all[@]}" --out "$OUT/qwen_8k.json"
# 3. the pair at 16K, batch 1, greedy
$TRIFORCE bench "${pair[@]}" --lengths 16000 --temperatures 0 --modes ar triforce auto --out "$OUT/qwen_16k.json"
# 2b. auto on the pair again at 8K after its last change (ec067b3), against ar and draft, the modes that
# led in step 2
$TRIFORCE bench "${pair[@]}" --lengths 7936 --temperatures 0 0.6 --modes ar draft auto --out "$OUT/qwen_8k_auto.json"
