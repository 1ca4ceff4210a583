#!/bin/bash
# cold auto A/B: before = HEAD~1 worktree, after = /work/main; each run a fresh calibration with the costs only
set -e
run() {  # name dir
  cal=/tmp/cal_$1; rm -rf $cal; mkdir -p $cal; cp /tmp/calA3/costs-2.json $cal/
  if [ $2 = before ]; then
    (cd /tmp/before2 && PYTHONPATH=/tmp/before2 TORCH_EXTENSIONS_DIR=/tmp/ext_before2 TRIFORCE_CALIBRATION=$cal TRIFORCE_CPU_ISA=avx2 /work/main/.venv/bin/python -m triforce bench --text /work/shared/data/austen-emma.txt --lengths 7936 --temperatures 0 --max-new-tokens 128 --modes ar draft auto --out /tmp/e2e/cold_$1.json > /tmp/e2e/cold_$1.log 2>&1)
  else
    (cd /work/main && TRIFORCE_CALIBRATION=$cal TRIFORCE_CPU_ISA=avx2 .venv/bin/python -m triforce bench --text /work/shared/data/austen-emma.txt --lengths 7936 --temperatures 0 --max-new-tokens 128 --modes ar draft auto --out /tmp/e2e/cold_$1.json > /tmp/e2e/cold_$1.log 2>&1)
  fi
}
run before_1 before; run after_1 after; run before_2 before; run after_2 after
echo done > /tmp/e2e/cold_done
