#!/bin/bash
# Whether a draft ships: in turns, issue 12's batch bench (eight prompts of 7,936 tokens cut from the six
# novels, greedy and at 0.6, modes ar, draft, retrieval and triforce), then issue 14's prose the drafts
# never saw (benchmarks/draft_generalises.sh: Emma and KJV Genesis, batch 1, 256 new tokens). Draft
# folders are named by their basename (make links). GENERALISES=0 runs the batch bench only; OUT=DIR writes there. Run from the
# repository root:
#   TURNS=2 bash benchmarks/results/issue12/amx16/ship/run.sh DRAFT_DIR...
set -e
here=${OUT:-benchmarks/results/issue12/amx16/ship}; mkdir -p "$here"
for turn in $(seq 1 "${TURNS:-2}"); do
  for draft in "$@"; do
    .venv/bin/triforce bench --text ../shared/data/austen-{emma,mansfieldpark,northangerabbey,persuasion,prideprejudice,sensesensibility}.txt \
      --lengths 7936 --batch 8 --temperatures 0 0.6 --max-new-tokens 128 --modes ar draft retrieval triforce \
      --repeats 1 --prefix-cache-gb 4 --draft "$draft" --out "$here/b8_$(basename "$draft")_turn${turn}.json" > /dev/null
  done
done
[ "${GENERALISES:-1}" = 0 ] || TRIFORCE=.venv/bin/triforce bash benchmarks/draft_generalises.sh "$here/generalises" "$@"
