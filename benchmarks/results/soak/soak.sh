#!/bin/bash
# A soak of `triforce serve` (docs/serving.md, Memory over hours), from the repository root:
#   bash benchmarks/results/soak/soak.sh NAME PORT DURATION_S [ENV=VALUE ...]
# starts a server (default settings, its own calibration), runs benchmarks/soak_load.py against it for
# DURATION_S seconds, and records its VmRSS at the end and 30 s later, then stops it with SIGINT.
# monitor_before.jsonl: 20 minutes at d7f8cd6 (before release_freed); monitor_trim.jsonl: 12 minutes after.
# SERVE="python benchmarks/serve_memory_probe.py" runs the server under that probe (records in $OUT/probe.jsonl).
NAME=$1; PORT=$2; DUR=$3; shift 3
OUT=soak-out/$NAME
mkdir -p $OUT
SERVE=${SERVE:-.venv/bin/triforce serve}
env "$@" TRIFORCE_CALIBRATION=$OUT/calibration PROBE_OUT=$OUT/probe.jsonl $SERVE --port $PORT > $OUT/server.log 2>&1 &
SPID=$!
for i in $(seq 120); do curl -s localhost:$PORT/health >/dev/null && break; sleep 1; done
SOAK_OUT=$OUT .venv/bin/python benchmarks/soak_load.py $PORT $SPID $DUR > $OUT/load.out 2>&1
echo "end $(grep VmRSS /proc/$SPID/status)" >> $OUT/rss.txt
sleep 30
echo "idle $(grep VmRSS /proc/$SPID/status)" >> $OUT/rss.txt
kill -INT $SPID; wait $SPID
