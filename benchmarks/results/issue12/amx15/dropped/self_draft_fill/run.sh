#!/bin/bash
# A/B of the self draft filled from the target's cache (self_draft_fill.patch, d0a4312) against its parent
# (20ca0ad), turns alternating, `--draft self` in `draft` mode at 8 x 8K (the files beside this script):
#   OLD_TREE=/tmp/wt_old NEW_TREE=/work/main OUT=/tmp/ab DATA=/work/shared/data \
#       bash benchmarks/results/issue12/amx15/dropped/self_draft_fill/run.sh
# with OLD_TREE a worktree of 20ca0ad and NEW_TREE one of d0a4312 (or this checkout with the patch applied).
set -e
mkdir -p $OUT
for turn in 1 2; do
  for arm in old new; do
    dir=$([ $arm = old ] && echo $OLD_TREE || echo $NEW_TREE)
    (cd $dir && PYTHONPATH=$dir $NEW_TREE/.venv/bin/triforce bench --draft self --text $DATA/austen-*.txt \
      --lengths 7936 --batch 8 --temperatures 0 0.6 --max-new-tokens 128 --modes ar draft --repeats 1 \
      --prefix-cache-gb 4 --out $OUT/${arm}_turn$turn.json > $OUT/${arm}_turn$turn.log 2>&1)
  done
done
