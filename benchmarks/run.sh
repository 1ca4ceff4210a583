#!/usr/bin/env bash
# The benchmark behind docs/speed.md's tables and plots (SmolLM2-135M, bfloat16, 256 new tokens, Austen's
# Emma, which the shipped draft never saw in training). About 40 minutes on a 2-core CPU; nothing else
# may run meanwhile, or the ratios mean nothing.
#   benchmarks/run.sh [RESULTS_DIR] [TEXT]       (make bench runs it into bench-out/)
set -euo pipefail
OUT=${1:-bench-out}
TEXT=${2:-${TEXT:-../shared/data/austen-emma.txt}}
if [[ ! -f "$TEXT" ]]; then  # (the docs' runs read Emma from the workplace's shared data, beside the checkout)
    echo "benchmarks/run.sh: no text at $TEXT: name a long one, e.g. TEXT=emma.txt make bench (Project Gutenberg's Emma in the docs' runs)" >&2
    exit 2
fi
TRIFORCE=${TRIFORCE:-triforce}
PYTHON=${PYTHON:-python}
mkdir -p "$OUT"
# 0. the kernels' read rates (cold weights and KV cache)
$PYTHON benchmarks/linear_bandwidth.py > "$OUT/linear_bandwidth.json"
$PYTHON benchmarks/attention_bandwidth.py > "$OUT/attention_bandwidth.json"
common=(--text "$TEXT" --max-new-tokens 256)
modes=(--modes ar draft retrieval triforce)
# 1. speed against ar and transformers generate: novel workload, 2K/4K/8K, temperatures 0 and 0.6
$TRIFORCE bench "${common[@]}" "${modes[@]}" --lengths 2048 4096 7936 --temperatures 0 0.6 \
    --peers transformers llamacpp ${GGUF:+--gguf "$GGUF"} --out "$OUT/speed.json"
# 2. transformers assisted generation with the same draft: about 1 token/s here, so 2K and greedy only
$TRIFORCE bench "${common[@]}" --modes ar triforce --lengths 2048 --peers transformers assisted \
    --out "$OUT/assisted.json"
# 3. passkey retrieval at 8K
$TRIFORCE bench "${common[@]}" "${modes[@]}" --workloads passkey --lengths 7936 --out "$OUT/passkey.json"
# 4. per-tier acceptance against temperature
$TRIFORCE bench "${common[@]}" --lengths 7936 --temperatures 0 0.3 0.6 0.9 1.2 --modes ar triforce \
    --out "$OUT/temperature.json"
# 5. sweeps of the defaults at 8K, temperature 0.6
for sweep in budget=256,512,1024,2048,4096 chunk_size=1,4,8,16,32 gamma1=1,2,3 gamma2=4,6,8; do
    $TRIFORCE bench "${common[@]}" --lengths 7936 --temperatures 0.6 --modes ar triforce --sweep "$sweep" \
        --out "$OUT/sweep_${sweep%%=*}.json"
done
# 6. the pipeline's cost on one machine: --workers 1 (torchrun, gloo) against one process, 8K prompt
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
$PYTHON benchmarks/plot.py --speedup "$OUT/speed.json" --temperature "$OUT/temperature.json" \
    --budget "$OUT/sweep_budget.json" --chunk "$OUT/sweep_chunk_size.json" --out-dir "$OUT"
