#!/usr/bin/env bash
# The OpenAI-compatible server on one node with N GPUs: the coordinator (tiers 1 and 2, the HTTP server)
# on GPU 0, the target sharded over GPUs 1..N-1, which also keep recent prompts' blocks for reuse
# (--prefix-cache-gb on each). The command comes first; every flag of `triforce serve` follows.
# Not run here: this project has had no GPU. On CPUs: DEVICE=cpu serve_one_node.sh --worker-device cpu, as
# `triforce serve --workers N-1` runs (tests/launch/test_distributed.py).
#   NGPU=4 MODEL=org/name triforce/launch/recipes/serve_one_node.sh --api-key "$KEY"
set -euo pipefail
NGPU=${NGPU:-4}
torchrun --standalone --nproc-per-node "$NGPU" -m triforce.launch.distributed serve \
    --model "${MODEL:-smollm2}" --device "${DEVICE:-cuda:0}" --host "${HOST:-0.0.0.0}" --port "${PORT:-8000}" "$@"
