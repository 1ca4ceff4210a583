#!/bin/bash
# A/B of d909170 (a draft's chains that run to gamma note where a stopping chain would have ended, so
# mode auto learns the stop rates in `draft` mode too) against its parent 6ad5cca: SmolLM2 at 7,936 tokens
# of Emma, 128 new tokens, modes ar draft triforce auto; greedy three turns ("seeds" 0-2: the same text),
# then 0.6 over seeds 0-5, each seed run by the old checkout and then the new (benchmarks/resumable_bench.sh:
# alternating; each side its own TRIFORCE_HOME, the calibration copied from the usual one once).
#   git worktree add --detach /tmp/wt_old 6ad5cca; git worktree add --detach /tmp/wt_new d909170
#   PATH=$PWD/.venv/bin:$PATH bash benchmarks/results/issue12/stop_watch/ab.sh /tmp/wt_old /tmp/wt_new
# Tables: python benchmarks/seed_means.py benchmarks/results/issue12/stop_watch/*_t06_seed*.json --against best
#   (per label: each checkout's short commit), and the same on *_greedy_seed*.json
set -e
old=${1:?old checkout} new=${2:?new checkout}
folder=$PWD/benchmarks/results/issue12/stop_watch
source benchmarks/resumable_bench.sh
args="--text $PWD/../shared/data/austen-emma.txt --lengths 7936 --max-new-tokens 128 --prefix-cache-gb 1 --modes ar draft triforce auto"
alternating "$old" "$new" "$folder" greedy "0 1 2" $args --temperatures 0
alternating "$old" "$new" "$folder" t06 "0 1 2 3 4 5" $args --temperatures 0.6
