# Sourced by benchmarks/results/*/run.sh, which set $out (their folder) and $common (the bench arguments
# every run shares). `resumable NAME ARGS...` runs `triforce bench $common ARGS` into $out/NAME.json, its
# log beside it, unless that file exists: a finished run is kept, a killed one (NAME.json.tmp) is redone.
# `triforce` must be on PATH: the virtual environment active (or its bin/ first on PATH).
resumable() {
  local file=$out/$1.json; shift
  [ -f "$file" ] || { triforce bench $common "$@" --out "$file.tmp" > "$file.log" 2>&1 && mv "$file.tmp" "$file"; }
}
# `calibration_home DIR`: DIR as a TRIFORCE_HOME with a calibration (costs, priors) of its own and the
# models and downloads of the usual one, so that a label's runs start from a fresh calibration.
calibration_home() {
  mkdir -p "$1"
  for d in models downloads; do ln -sfn "${TRIFORCE_HOME:-$HOME/.cache/triforce}/$d" "$1/$d"; done
}
# `labelled_runs FOLDER TAG LABEL`: a label's results go in FOLDER/LABEL ($out), its runs use $home
# (HOME_FOR_RUN, else a fresh calibration home /tmp/triforce_home_TAG_LABEL) and read $text (TEXT, else Emma).
labelled_runs() {
  out=$1/$3
  home=${HOME_FOR_RUN:-/tmp/triforce_home_$2_$3}
  text=${TEXT:-../shared/data/austen-emma.txt}
  mkdir -p "$out"
  calibration_home "$home"
}
# `alternating OLD NEW FOLDER TAG "SEEDS" BENCH_ARGS...`: an A/B of two checkouts, each seed run from OLD and
# then NEW (so that a slow spell of a shared machine touches both), `python -m triforce bench BENCH_ARGS
# --seed S` into FOLDER/LABEL_TAG_seedS.json (LABEL: the checkout's short commit), each side with its own
# TRIFORCE_HOME, /tmp/triforce_home_TAG_old or _new: the models linked, the calibration copied from the usual
# one the first time, so that neither side's priors leak into the other's.
alternating() {
  local old=$1 new=$2 folder=$3 tag=$4 seeds=$5; shift 5
  for s in $seeds; do
    for side in old new; do
      local dir=${!side} home=/tmp/triforce_home_${tag}_$side
      if [ ! -d "$home" ]; then
        calibration_home "$home" && cp -r "${TRIFORCE_HOME:-$HOME/.cache/triforce}/calibration" "$home/"
      fi
      (cd "$dir" && TRIFORCE_HOME=$home PYTHONPATH=$dir python -m triforce bench "$@" --seed "$s" \
        --out "$folder/$(git -C "$dir" rev-parse --short HEAD)_${tag}_seed$s.json")
    done
  done
}
