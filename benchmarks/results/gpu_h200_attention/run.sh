#!/usr/bin/env bash
# Why `ar` in the float32 bench ran no faster with CUDA graphs (29 tokens/s), and the mend: NVIDIA H200s
# (device tool, 2026-11-28, the third session with one; torch 2.11.0+cu130, transformers 5.24.0, no
# flash-attn, 16 CPU cores), 789 s of device time in four calls on two fresh machines; GPU_KIT (.gpu,
# git-ignored) made by benchmarks/gpu_kit.sh. calls.txt holds what the calls printed that did not come back
# as files (the tool returns at most 8).
#   1. at 72b1c8f (before): the CUDA graph tests, the bench's own float32 ar run under cProfile
#      (before/bench_ar_cprofile.*), gpu_profile.py's float32 greedy ar at 7,936 tokens with graphs,
#      the float32 exactness benches (before/bench_f32*.json: chains, and trees at batch 1 and 4) and the
#      suite without `slow`:
PROFILE_BENCH=1 PROFILE_MODES="ar" PROFILE_ARGS="--dtype float32 --context 7936 --temperature 0 --tokens 96" \
  PROFILE_S=60 BENCH_F32_S=60 BENCH_TREES_S=70 SUITE_S=210 BF16_BATCHES="" bash benchmarks/gpu_check.sh
#   2. the same profile sorted by the GPU's time (warm machine; gpu_profile.py sorted by self_cuda_time_total)
#      and SDPA against plain matmuls for one query of 9 heads (calls.txt)
#   3. at the mend (after/): the attention tests and the graph tests, SDPA against plain matmuls inside CUDA
#      graphs (.gpu/graph_attn.py, its text in calls.txt), the profile again, the float32 chain bench:
python3 benchmarks/gpu_profile.py --model /tmp/random-smollm2 --modes ar --dtype float32 --context 7936 \
  --temperature 0 --tokens 48 --out after
python3 -m triforce bench --model /tmp/random-smollm2 --draft triforce/drafts/smollm2 --text .gpu/austen-emma.txt \
  --lengths 7936 --device cuda --dtype float32 --temperatures 0 --max-new-tokens 96 \
  --modes ar draft retrieval triforce --out after/bench_f32.json
#   4. (warm) pytest tests/kernels/test_attention.py -k "cuda or matmul" tests/models/test_cuda_graphs.py: 49 passed
