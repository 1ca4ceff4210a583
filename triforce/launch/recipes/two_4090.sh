#!/usr/bin/env bash
# A workstation with two RTX 4090s: coordinator on GPU 0, one worker (the whole target, tensor-parallel
# size 1) on GPU 1. Not run here: this project has had no GPU.
set -euo pipefail
torchrun --standalone --nproc-per-node 2 -m triforce.launch.distributed \
    --model "${MODEL:-smollm2}" --device cuda:0 --prompt-file "${PROMPT:-examples/long_prompt.txt}" \
    --max-new-tokens 256 "$@"
