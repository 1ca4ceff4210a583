#!/bin/bash
# A/B of a batch's pooled acceptance (one prior per member, 2026-12-07) against the code before, two turns
# each, every arm from its own copy of one calibration folder (so each learns only from its own runs):
#   BASE_TREE=/tmp/wt1 NEW_TREE=/work/main OUT=/tmp/ab DATA=/work/shared/data HOME_FROM=~/.cache/triforce \
#       bash benchmarks/results/issue12/amx14/pooled_priors/run.sh
# with BASE_TREE a worktree of e82ba23 (git worktree add --detach /tmp/wt1 e82ba23). Tables:
#   python benchmarks/auto_table.py $OUT/base_turn1.json ... (the *_turn*.json files beside this script)
set -e
for arm in base new; do
  rm -rf $OUT/home_$arm && mkdir -p $OUT/home_$arm
  cp -r $HOME_FROM/calibration $OUT/home_$arm/ && ln -s $HOME_FROM/models $OUT/home_$arm/models
done
for turn in 1 2; do
  for arm in base new; do
    if [ $arm = base ]; then dir=$BASE_TREE; else dir=$NEW_TREE; fi
    (cd $dir && TRIFORCE_HOME=$OUT/home_$arm PYTHONPATH=$dir $NEW_TREE/.venv/bin/triforce bench \
      --text $DATA/austen-*.txt --lengths 7936 --batch 8 --temperatures 0 0.6 --max-new-tokens 128 \
      --modes draft triforce auto --repeats 2 --prefix-cache-gb 4 --out $OUT/${arm}_turn$turn.json \
      > $OUT/${arm}_turn$turn.log 2>&1)
  done
done
