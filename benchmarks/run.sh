#!/usr/bin/env bash
# The benchmark behind the README's tables and plots (SmolLM2-135M, bfloat16, 256 new tokens, Austen's
# Emma, which the shipped draft never saw in training). About 45 minutes on a 2-core CPU.
#   benchmarks/run.sh [RESULTS_DIR] [TEXT]       (make bench runs it into bench-out/)
set -euo pipefail
OUT=${1:-bench-out}
TEXT=${2:-../shared/data/austen-emma.txt}
TRIFORCE=${TRIFORCE:-triforce}
PYTHON=${PYTHON:-python}
mkdir -p "$OUT"
common=(--text "$TEXT" --max-new-tokens 256)
# 1. speed against ar and the peers: novel workload, 2K/4K/8K; temperature 0 with every peer, 0.6 with
#    transformers plain generate (assisted generation runs about 1 token/s here: see the README)
$TRIFORCE bench "${common[@]}" --workloads novel --lengths 2048 4096 7936 --temperatures 0 \
    --modes ar draft retrieval triforce --peers transformers assisted llamacpp ${GGUF:+--gguf "$GGUF"} \
    --out "$OUT/speed_t0.json"
$TRIFORCE bench "${common[@]}" --workloads novel --lengths 2048 4096 7936 --temperatures 0.6 \
    --modes ar draft retrieval triforce --peers transformers --out "$OUT/speed_t06.json"
# 2. passkey retrieval at 8K
$TRIFORCE bench "${common[@]}" --workloads passkey --lengths 7936 --temperatures 0 0.6 \
    --modes ar draft retrieval triforce --out "$OUT/passkey.json"
# 3. per-tier acceptance against temperature
$TRIFORCE bench "${common[@]}" --lengths 7936 --temperatures 0 0.3 0.6 0.9 1.2 --modes ar triforce \
    --out "$OUT/temperature.json"
# 4. sweeps of the defaults at 8K, temperature 0.6
for sweep in budget=256,512,1024,2048,4096 chunk_size=1,2,4,8,16,32 gamma1=1,2,3,4 gamma2=4,6,8,10 \
             window=64,128,256,512; do
    $TRIFORCE bench "${common[@]}" --lengths 7936 --temperatures 0.6 --modes ar triforce --sweep "$sweep" \
        --out "$OUT/sweep_${sweep%%=*}.json"
done
# 5. the pipeline's cost on one machine: --workers 1 (torchrun, gloo) against one process, 8K prompt
$PYTHON - "$TEXT" "$OUT/prompt_8k.txt" <<'PY'
import sys
from transformers import AutoTokenizer
from triforce.models.hub import resolve_model
tok = AutoTokenizer.from_pretrained(resolve_model("smollm2"))
ids = tok(open(sys.argv[1], encoding="utf-8").read()).input_ids[:7900]
open(sys.argv[2], "w", encoding="utf-8").write(tok.decode(ids))
PY
for workers in 0 1; do
    $TRIFORCE generate --prompt-file "$OUT/prompt_8k.txt" --max-new-tokens 256 --temperature 0 --ignore-eos \
        --json --no-progress --workers $workers --worker-device cpu > "$OUT/pipeline_workers$workers.json"
done
$PYTHON benchmarks/plot.py --speedup "$OUT/speed_t0.json" "$OUT/speed_t06.json" --temperature "$OUT/temperature.json" \
    --budget "$OUT/sweep_budget.json" --chunk "$OUT/sweep_chunk_size.json" --out-dir "$OUT"
