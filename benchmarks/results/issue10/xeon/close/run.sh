#!/bin/bash
# Issue 10's closing measurement on the 2-core AMX Xeon at the avx2 level, taking turns:
#   before = 71cf1b3 (the landed code when the issue was filed; its kernels need AVX512-BF16, so an AVX2-only
#            CPU ran torch's paths: TRIFORCE_CPU_KERNELS=0 and torch at AVX2), its default mode (triforce) and ar
#   after  = this code, default settings (mode auto, dtype auto), with llama.cpp (llama-cpp-python 0.3.36 built
#            for AVX2 only, in $LLAMA_AVX2) on the Q4_1 GGUF the default model comes from ($SMOL_GGUF)
#   peer   = transformers in float32, its fastest dtype here, for prefill
# BEFORE: a worktree of 71cf1b3. Run from the repository root; nothing else may run meanwhile.
set -euo pipefail
OUT=$PWD/benchmarks/results/issue10/xeon/close
EMMA=$(realpath ../shared/data/austen-emma.txt)
PY=$PWD/.venv/bin/python
common=(--text $EMMA --lengths 7936 --temperatures 0 --max-new-tokens 128)
before() {
  (cd "$BEFORE" && TRIFORCE_CPU_KERNELS=0 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 PYTHONPATH="$BEFORE" \
     $PY -m triforce bench "${common[@]}" --modes ar triforce --out $OUT/before_$1.json) > $OUT/before_$1.log 2>&1
}
after() {
  TRIFORCE_CPU_ISA=avx2 PYTHONPATH="$LLAMA_AVX2" .venv/bin/triforce bench "${common[@]}" \
    --modes ar draft triforce auto --peers llamacpp --gguf "$SMOL_GGUF" --repeats 2 --out $OUT/after_$1.json \
    > $OUT/after_$1.log 2>&1
}
after 1; before 1; after 2; before 2
TRIFORCE_CPU_ISA=avx2 .venv/bin/triforce bench "${common[@]}" --dtype float32 --modes ar --peers transformers \
  --out $OUT/transformers_float32.json > $OUT/transformers_float32.log 2>&1
echo done > $OUT/done
