#!/bin/bash
# Mode auto at a1fa2b9 (before, a worktree at /tmp/abwt with .venv linked) and at this stop's code (after),
# fresh calibration each; round 1 (before.json, after.json) also ran triforce, before first; round 2 after first.
cd /work/main
for side in after before; do
  if [ $side = before ]; then root=/tmp/abwt; else root=/work/main; fi
  rm -rf benchmarks/results/issue12/stop66_ab/cal2_$side; mkdir -p benchmarks/results/issue12/stop66_ab/cal2_$side
  ( cd $root && PYTHONPATH=$root TRIFORCE_CALIBRATION=benchmarks/results/issue12/stop66_ab/cal2_$side TORCH_EXTENSIONS_DIR=benchmarks/results/issue12/stop66_ab/ext_$side \
    /usr/bin/time -f "$side wall %e" .venv/bin/python -m triforce.launch.cli bench --text /work/shared/data/austen-emma.txt \
    --lengths 7936 --temperatures 0 0.6 --max-new-tokens 256 --modes ar draft auto \
    --out benchmarks/results/issue12/stop66_ab/${side}2.json ) > benchmarks/results/issue12/stop66_ab/${side}2.log 2>&1
done
echo done > benchmarks/results/issue12/stop66_ab/done2
