#!/bin/bash
# A/B of a batch's pooled acceptance (one prior per member, 6a81cea) against the code before, turn by turn,
# each arm from its own copy of one calibration folder (so each learns only from its own runs; copied once,
# where $OUT has none yet):
#   BASE_TREE=/tmp/wt1 NEW_TREE=/work/main OUT=/tmp/ab DATA=/work/shared/data HOME_FROM=~/.cache/triforce \
#       [BATCH=8] [TURNS="1 2"] bash benchmarks/results/issue12/amx14/pooled_priors/run.sh
# with BASE_TREE a worktree of e82ba23 (git worktree add --detach /tmp/wt1 e82ba23). Tables:
#   python benchmarks/auto_table.py $OUT/base_turn1.json ... (the files beside this script: batch 8, turns
#   1-2 from fresh copies; b4_turn* at BATCH=4 after them, then turn 3 at batch 8, on the same folders)
set -e
BATCH=${BATCH:-8}
TURNS=${TURNS:-1 2}
tag=$([ "$BATCH" = 8 ] && echo "" || echo "b${BATCH}_")
for arm in base new; do
  if [ ! -d $OUT/home_$arm ]; then
    mkdir -p $OUT/home_$arm
    cp -r $HOME_FROM/calibration $OUT/home_$arm/ && ln -s $HOME_FROM/models $OUT/home_$arm/models
  fi
done
for turn in $TURNS; do
  for arm in base new; do
    if [ $arm = base ]; then dir=$BASE_TREE; else dir=$NEW_TREE; fi
    (cd $dir && TRIFORCE_HOME=$OUT/home_$arm PYTHONPATH=$dir $NEW_TREE/.venv/bin/triforce bench \
      --text $DATA/austen-*.txt --lengths 7936 --batch $BATCH --temperatures 0 0.6 --max-new-tokens 128 \
      --modes draft triforce auto --repeats 2 --prefix-cache-gb 4 --out $OUT/${arm}_${tag}turn$turn.json \
      > $OUT/${arm}_${tag}turn$turn.log 2>&1)
  done
done
