#!/usr/bin/env bash
# NVIDIA H200s (device tool, 2026-11-28; torch 2.11.0+cu130, transformers 5.24.0, no flash-attn; 16 CPU
# cores): call 1 at commit c5b3748, call 2 at e461091 (gpu_check.sh as there). GPU_KIT (.gpu,
# git-ignored) made by benchmarks/gpu_kit.sh.
# 819 s of device time in two calls, each on a fresh machine (the second a different H200).
#   1. env.txt, bench_f32.json, bench_f32_trees.json, pytest.log (995 passed, 172 skipped, 263 s), and
#      bench_bf16.log (batch 1, one turn; cut by its 100 s limit in its ninth run):
SUITE_S=270 BENCH_S=100 BENCH_F32_S=60 BENCH_TREES_S=70 bash benchmarks/gpu_check.sh
#   2. bench_bf16_batch8.log and env_call2.txt (this call's bench_bf16.log and env.txt, renamed beside call
#      1's; every batch-8 run twice, taking turns; cut by its 200 s limit in the temperature-0.6 runs):
SPEED_ONLY=1 BF16_BATCHES=8 BF16_ARGS="--repeats 2" BENCH_S=200 bash benchmarks/gpu_check.sh
