#!/bin/bash
# The Qwen pair in a batch of four at 8K greedy on the AVX2 EPYC, at f6827f5 (an idle draft watched only
# while it can pay): qwen_greedy_7936_batch4.json (ar, then auto restoring the prompts' KV):
TRIFORCE_HOME=/tmp/th_qwen_avx2 PATH=$PWD/.venv/bin:$PATH bash benchmarks/results/issue12/avx2_epyc/qwen_batch4.sh f6827f5
# batch_timeline_{2048,4096}.jsonl: where a batch of four's decode goes at 2K and 4K (prompts cut from Emma),
# `ar` then auto, each in a fresh calibration folder:
for n in 2048 4096; do
  TRIFORCE_HOME=/tmp/th_qwen_avx2 TRIFORCE_CALIBRATION=/tmp/calib_timeline$n python benchmarks/batch_timeline.py \
    --model qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --text ../shared/data/austen-emma.txt --length $n \
    --batch 4 --temperature 0 --modes ar auto
done
# ../f6827f5_r3/qwen_greedy_7936_batch4.json: the same point, each mode three times taking turns (a fresh
# calibration; auto's later requests plan from what the first saw), at f6827f5:
TRIFORCE_HOME=/tmp/th_qwen_avx2 PATH=$PWD/.venv/bin:$PATH REPEATS=3 bash benchmarks/results/issue12/avx2_epyc/qwen_batch4.sh f6827f5_r3
