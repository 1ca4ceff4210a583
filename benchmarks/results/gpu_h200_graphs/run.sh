#!/usr/bin/env bash
# The CUDA graphs of triforce/models/cuda_graphs.py on NVIDIA H200s (device tool, 2026-11-28; torch
# 2.11.0+cu130, transformers 5.24.0, no flash-attn; 16 CPU cores), 769 s of device time in two calls on
# fresh machines. GPU_KIT (.gpu, git-ignored) made by benchmarks/gpu_kit.sh.
#   1. at 5ff697e: pytest_graphs_call1.log (2 failures: a size's first forward returned the graph's
#      output unwritten, since a capture runs nothing), bench_f32_call1.json and bench_f32_trees_call1.json
#      (that bug made `triforce` differ from `ar`), profile.jsonl (ar with graphs and without; triforce's
#      runs were cut by PROFILE_S):
SUITE=0 PROFILE_MODES="ar triforce" BF16_BATCHES="" BENCH_F32_S=90 BENCH_TREES_S=90 PROFILE_S=110 \
  bash benchmarks/gpu_check.sh
#   2. at the mend (replay right after capture): pytest_graphs.log (all pass), bench_f32.json and
#      bench_f32_trees.json (every mode equals ar, trees at batch 1 and 4 too), pytest.log (the suite without
#      `slow`: 1043 passed, 172 skipped, 1 failed: the batch job's kill-and-restart test, whose job had
#      written no line when its 12 s wait ended; now it waits up to 120 s and shows the job's stderr):
SUITE_S=230 BF16_BATCHES="" BENCH_F32_S=70 BENCH_TREES_S=80 bash benchmarks/gpu_check.sh
