#!/usr/bin/env bash
# What a lent GPU machine checks in one call (device tool; see docs/gpu.md):
#   1. `triforce bench` on CUDA over a random-weight target of SmolLM2's shape (benchmarks/random_target.py;
#      the real weights cannot travel) with the shipped draft, float32 greedy, where every mode must equal
#      `ar` token for token: chains at batch 1, then token trees at batch 1 and 4;
#   2. the test suite without the `slow` marker (no network there to fetch SmolLM2), in parallel; tests
#      that build an `LLM` without a device run on cuda there;
#   3. (right after the CUDA graph tests) with PROFILE_MODES (e.g. "ar triforce"): benchmarks/gpu_profile.py on those modes with the CUDA graphs
#      of models/cuda_graphs.py and without (TRIFORCE_CUDA_GRAPHS=0), bfloat16, 4,096 tokens of context
#      unless PROFILE_ARGS says otherwise (e.g. "--dtype float32 --context 7936 --temperature 0");
#      with PROFILE_BENCH=1, first step 1's `ar` bench again under cProfile (bench_ar_cprofile.txt);
#   4. the bench in bfloat16 at batch 1 and 8, every mode at temperatures 0 and 0.6 (speed).
# Knobs: SPEED_ONLY=1 (step 4 alone), SUITE=0 (no step 2), BF16_BATCHES (default "1 8"; "" skips step 4),
# BF16_ARGS (more bench options, such as --repeats 2), PROFILE_ARGS, PROFILE_BENCH, TREE1 (step 1's tree size, 8); time limits
# BENCH_F32_S, BENCH_TREES_S, SUITE_S, PROFILE_S (each), BENCH_S. Step 1 starts with the CUDA graph tests.
# First what breaks most often, so that a call cut short has still checked it (a profile, when asked, comes
# right after the graph tests: its question came first that time).
# Needs $GPU_KIT (default .gpu), made by benchmarks/gpu_kit.sh: whl/ (wheels the machine lacks), tok/
# (SmolLM2's config.json and tokenizer files), austen-emma.txt. Carry it: device run, carry [".gpu"].
# Writes into $OUT: env.txt, pytest_graphs.log, bench_f32.json, bench_f32_trees.json, pytest.log,
# profile.jsonl and profile_graphs{1,0}/, bench_bf16.json (with logs), calibration.tar.
case "${1:-}" in -h|--help) sed -n '2,/^case /p' "$0" | sed '$d'; exit 0;; esac
set -uo pipefail
kit=${GPU_KIT:-.gpu}; OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
{ nvidia-smi -L; python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())"
  g++ --version | head -1; nproc; } > "$OUT/env.txt" 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$kit"/whl/*.whl \
  || { echo "wheels did not install"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRIFORCE_HOME=/tmp/triforce-home
python3 -c "import transformers; print('transformers', transformers.__version__)" >> "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
python3 benchmarks/random_target.py --like "$kit/tok" --out /tmp/random-smollm2 || exit 1
base=(--model /tmp/random-smollm2 --text "$kit/austen-emma.txt" --lengths 7936 --device cuda)
common=("${base[@]}" --draft triforce/drafts/smollm2)  # (bench refuses --draft where no mode runs one)
if [ -z "${SPEED_ONLY:-}" ]; then  # SPEED_ONLY=1: step 4 alone
  timeout -k 10 120 python3 -m pytest -q -p no:cacheprovider -rfE --tb=short tests/models/test_cuda_graphs.py \
    2>&1 | tee "$OUT/pytest_graphs.log" | tail -15
  if [ -n "${PROFILE_BENCH:-}" ]; then
    timeout -k 10 ${PROFILE_S:-120} python3 -m cProfile -o "$OUT/bench_ar.prof" -m triforce bench "${base[@]}" \
      --dtype float32 --temperatures 0 --max-new-tokens 96 --modes ar > "$OUT/bench_ar_cprofile.log" 2>&1
    python3 -c "import pstats, sys; s = pstats.Stats(sys.argv[1]); s.sort_stats('tottime').print_stats(40)
s.sort_stats('cumulative').print_stats(40)" "$OUT/bench_ar.prof" > "$OUT/bench_ar_cprofile.txt" 2>&1
    grep -h '"run"' "$OUT/bench_ar_cprofile.log" | cut -c1-220; head -60 "$OUT/bench_ar_cprofile.txt" | tail -45
  fi
  for graphs in 1 0; do
    [ -n "${PROFILE_MODES:-}" ] || break
    mkdir -p "$OUT/profile_graphs$graphs"
    TRIFORCE_CUDA_GRAPHS=$graphs timeout -k 10 ${PROFILE_S:-120} python3 benchmarks/gpu_profile.py \
      --model /tmp/random-smollm2 --draft triforce/drafts/smollm2 --modes $PROFILE_MODES ${PROFILE_ARGS:-} \
      --out "$OUT/profile_graphs$graphs" 2>&1 | tee -a "$OUT/profile.jsonl" | tail -4
  done
  timeout -k 10 ${BENCH_F32_S:-60} python3 -m triforce bench "${common[@]}" --dtype float32 --temperatures 0 \
    --max-new-tokens 96 --modes ar draft retrieval triforce --out "$OUT/bench_f32.json" > "$OUT/bench_f32.log" 2>&1
  echo "bench f32 rc=$?"; tail -5 "$OUT/bench_f32.log"
  timeout -k 10 ${BENCH_TREES_S:-60} python3 -m triforce bench "${common[@]}" --dtype float32 --temperatures 0 \
    --max-new-tokens 96 --modes ar draft triforce --tree1 ${TREE1:-8} --batch 1 4 \
    --out "$OUT/bench_f32_trees.json" > "$OUT/bench_f32_trees.log" 2>&1
  echo "bench f32 trees rc=$?"; tail -5 "$OUT/bench_f32_trees.log"
  [ "${SUITE:-1}" = 0 ] || OMP_NUM_THREADS=1 timeout -s INT -k 30 ${SUITE_S:-300} python3 -m pytest -q \
    -m "not slow" -n ${JOBS:-14} -p no:cacheprovider --timeout 240 -rfE --tb=short 2>&1 | tee "$OUT/pytest.log" \
    | tail -${TAIL:-60}
fi
[ -z "${BF16_BATCHES-1 8}" ] || timeout -k 10 ${BENCH_S:-150} python3 -m triforce bench "${common[@]}" --dtype bfloat16 --batch ${BF16_BATCHES:-1 8} \
  --temperatures 0 0.6 --max-new-tokens 128 --modes ar draft retrieval triforce auto ${BF16_ARGS:-} \
  --out "$OUT/bench_bf16.json" > "$OUT/bench_bf16.log" 2>&1; echo "bench bf16 rc=$?"; tail -5 "$OUT/bench_bf16.log"
tar -C "$TRIFORCE_HOME" -cf "$OUT/calibration.tar" calibration 2>/dev/null
