#!/usr/bin/env bash
# `triforce bench` as CPUs of each kernel level run it (kernels/cpu.py), on one machine: each level this
# CPU has, forced with TRIFORCE_CPU_ISA (avx2 also takes torch's own kernels down to AVX2), in bfloat16
# and float32, 8K of Emma, greedy, 128 new tokens; the float32 avx2 run adds `transformers` for the
# prefill comparison. One JSON per (level, dtype) in OUT; each records the level and kernel path it ran.
#   benchmarks/isa_levels.sh [OUT] [LEVELS...]     (default: bench-out/isa, every level the CPU has)
set -euo pipefail
OUT=${1:-bench-out/isa}
shift || true
TRIFORCE=${TRIFORCE:-triforce}
PYTHON=${PYTHON:-python}
LEVELS=("$@")
if [ ${#LEVELS[@]} -eq 0 ]; then
  read -r -a LEVELS <<< "$($PYTHON -c 'from triforce.kernels.cpu import available_levels; print(*available_levels())')"
fi
mkdir -p "$OUT"
for level in "${LEVELS[@]}"; do
  for dtype in bfloat16 float32; do
    peers=()
    if [ "$level" = avx2 ] && [ "$dtype" = float32 ]; then peers=(--peers transformers); fi
    TRIFORCE_CPU_ISA=$level $TRIFORCE bench --text ../shared/data/austen-emma.txt --lengths 7936 --temperatures 0 \
      --max-new-tokens 128 --modes ar triforce --dtype "$dtype" "${peers[@]}" --out "$OUT/${level}_${dtype}.json" > /dev/null
  done
done
