#!/bin/bash
# How the runs beside this file were made (docs/avx2.md): auto's speed factor measured at the
# acceptance its stretch saw, before (a worktree of commit 5cf154e at /tmp/wt_before: `git worktree add
# /tmp/wt_before 5cf154e`) and after (this checkout at /work/main), taking turns; each run with its own copy
# of the same calibration folder (the machine's costs and priors), so that neither learns from the other.
set -e
for i in 1 2; do
  for v in before after; do
    rm -rf /tmp/cal_$v_$i; mkdir -p /tmp/cal_${v}_$i; cp /root/.cache/triforce/calibration/*.json /tmp/cal_${v}_$i/
    dir=/work/main; [ $v = before ] && dir=/tmp/wt_before
    (cd $dir && TRIFORCE_CALIBRATION=/tmp/cal_${v}_$i TRIFORCE_CPU_ISA=avx2 /work/main/.venv/bin/python -m triforce bench \
      --text /work/shared/data/austen-emma.txt --lengths 7936 --temperatures 0 --max-new-tokens 128 \
      --modes ar draft auto --repeats 2 --out /tmp/b/ab_${v}_$i.json > /tmp/b/ab_${v}_$i.log 2>&1)
  done
done
echo done > /tmp/b/ab.done
