#!/bin/bash
# Whether the draft is short of capacity (docs/draft.md, *A deeper draft grown from mix5*): the shipped draft
# (mix5, 4 layers) trained on for 200 steps on the smaller mix of the acceptance A/B
# (benchmarks/results/issue12/avx2_epyc/acceptance_loss/run.sh), as it is (DIR/ce4) and grown to 8 layers
# first (DIR/grown8: `--layers 8` beside `--init`, each new layer starting as one that changes nothing), side by
# side with a thread each. Run from the repository root; WORK caches the data (generated once). Then issue
# 12's batch-8 bench in `draft` mode with mix5 and each arm, one after another (b8_*.json here; read them
# with benchmarks/bench_acceptance.py; BENCH=0 skips it). STEPS and LR (200 and 5e-4 by default) set both arms'
# training, which then write to DIR/ce4-STEPS-LR and DIR/grown8-STEPS-LR (and their .log):
#   WORK=/path/to/work DIR=/path/to/drafts [STEPS=400 LR=1e-3] bash benchmarks/results/issue12/amx17/grown/run.sh
set -e
WORK=${WORK:?set WORK} DIR=${DIR:?set DIR}
here=$(dirname "$0")
mkdir -p "$DIR"
common=(--target smollm2 --text ../shared/data/austen-{prideprejudice,sensesensibility,mansfieldpark,persuasion,northangerabbey}.txt
  --heldout ../shared/data/austen-emma.txt benchmarks/texts/kjv-genesis.txt --work-dir "$WORK" --init triforce/drafts/smollm2
  --local-tokens 200000 --answers 128 --continuations 256 --repeat prose=0 --steps "${STEPS:-200}" --lr "${LR:-5e-4}")
run=${STEPS:-200}-${LR:-5e-4}
.venv/bin/triforce train-draft "${common[@]}" --out "$DIR/ce4-$run" --data-only
OMP_NUM_THREADS=1 .venv/bin/triforce train-draft "${common[@]}" --out "$DIR/ce4-$run" > "$DIR/ce4-$run.log" 2>&1 &
OMP_NUM_THREADS=1 .venv/bin/triforce train-draft "${common[@]}" --out "$DIR/grown8-$run" --layers 8 > "$DIR/grown8-$run.log" 2>&1 &
wait
[ "${BENCH:-1}" = 0 ] && exit 0
ln -sfn "$PWD/triforce/drafts/smollm2" "$DIR/mix5"
for draft in "$DIR/mix5" "$DIR/ce4-$run" "$DIR/grown8-$run"; do
  .venv/bin/triforce bench --text ../shared/data/austen-{emma,mansfieldpark,northangerabbey,persuasion,prideprejudice,sensesensibility}.txt \
    --lengths 7936 --batch 8 --temperatures 0 0.6 --max-new-tokens 128 --modes ar draft --repeats 1 --prefix-cache-gb 4 \
    --draft "$draft" --out "$here/b8_$(basename "$draft").json" > /dev/null
done
