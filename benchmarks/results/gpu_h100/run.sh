#!/usr/bin/env bash
# One NVIDIA H100 80GB HBM3 (device tool, 2026-11-26; torch 2.11.0+cu130, transformers 5.24.0, no flash-attn),
# at commit 5daa94f plus this session's benchmarks/random_target.py, gpu_check.sh and gpu_profile.py.
# GPU_KIT (.gpu, git-ignored) held the wheels the machine lacked (pyzmq, gguf, fastapi, uvicorn, pydantic,
# openai and their needs; the first call lacked opentelemetry-api, which fastapi imports), SmolLM2's
# config and tokenizer, and Emma.
#   1. env.txt, bench_bf16.log (the bench was cut at 130 s, in its batch-8 runs; each finished run is a
#      JSON line of the log), bench_f32.json, pytest_suite.log:
BENCH_S=130 BENCH_F32_S=60 SUITE_S=270 bash benchmarks/gpu_check.sh
#   2. profile_ar.txt, cprofile_ar.txt (draft's and triforce's were cut by the timeout), then the failed
#      files again with opentelemetry-api added and the device fix of costs.machine_key (pytest_rerun.log):
python3 benchmarks/gpu_profile.py --model /tmp/random-smollm2 --draft triforce/drafts/smollm2 --context 4096 \
  --tokens 48 --modes ar draft triforce --out "$OUT"
python3 -m pytest -q -n 10 --timeout 90 -rfE --tb=short tests/test_prefix_reuse.py tests/draft/test_generated.py \
  tests/kernels/test_build.py tests/serve tests/launch/test_distributed.py
#   3. profile_triforce.txt, cprofile_triforce.txt:
python3 benchmarks/gpu_profile.py --model /tmp/random-smollm2 --draft triforce/drafts/smollm2 --context 4096 \
  --tokens 32 --modes triforce --out "$OUT"
# profile_summary.jsonl: the JSON lines gpu_profile.py printed in calls 2 and 3 (its gpu_busy_ms_per_token
# then counted each kernel's time twice, through the op that launched it too: the tables' "Self CUDA time
# total", 175.9 and 212.4 ms over the whole generate, prefill included, is the GPU's busy time; the script
# now counts kernels only, as gpu_busy_ms_per_token_with_prefill).
