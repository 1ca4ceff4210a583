#!/usr/bin/env bash
# What penalties cost, and whether speculation still pays with them: SmolLM2 bfloat16, 2,048 tokens of
# *Emma*, 128 new tokens, `ar` and `triforce` at greedy and 0.6, without penalties and with presence 0.5,
# frequency 0.5 and repetition 1.2, two turns taking turns. Run from the repository root:
#   bash benchmarks/results/penalties/run.sh
set -euo pipefail
out=benchmarks/results/penalties
common=(--text ../shared/data/austen-emma.txt --lengths 2048 --temperatures 0 0.6 --max-new-tokens 128
        --modes ar triforce)
for turn in 1 2; do
  triforce bench "${common[@]}" --out $out/off_turn$turn.json > /dev/null
  triforce bench "${common[@]}" --presence-penalty 0.5 --frequency-penalty 0.5 --repetition-penalty 1.2 \
    --out $out/on_turn$turn.json > /dev/null
done
# mode auto against ar with the same penalties (medians of two repeats, taking turns):
triforce bench --text ../shared/data/austen-emma.txt --lengths 2048 --temperatures 0 0.6 --max-new-tokens 128 \
  --modes ar auto --presence-penalty 0.5 --frequency-penalty 0.5 --repetition-penalty 1.2 --repeats 2 \
  --out $out/auto.json > /dev/null
# float32, greedy, 64 new tokens: triforce with the penalties equals ar token for token (f32_greedy.json)
triforce bench --text ../shared/data/austen-emma.txt --lengths 2048 --temperatures 0 --max-new-tokens 64 \
  --modes ar triforce --dtype float32 --presence-penalty 0.5 --frequency-penalty 0.5 --repetition-penalty 1.2 \
  --out $out/f32_greedy.json > /dev/null
