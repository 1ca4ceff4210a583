#!/usr/bin/env bash
# One node with N GPUs: the coordinator (tiers 1 and 2) on GPU 0, the target sharded over GPUs 1..N-1.
# torchrun gives rank r the device cuda:LOCAL_RANK, so the worker group uses GPUs 1..N-1.
# Not run here: this project has had no GPU. On CPUs: DEVICE=cpu one_node.sh --worker-device cpu.
set -euo pipefail
NGPU=${NGPU:-4}
torchrun --standalone --nproc-per-node "$NGPU" -m triforce.launch.distributed \
    --model "${MODEL:-smollm2}" --device "${DEVICE:-cuda:0}" --prompt-file "${PROMPT:-examples/long_prompt.txt}" \
    --max-new-tokens 256 "$@"
