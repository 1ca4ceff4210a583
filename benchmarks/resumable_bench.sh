# Sourced by benchmarks/results/*/run.sh, which set $out (their folder) and $common (the bench arguments
# every run shares). `resumable NAME ARGS...` runs `triforce bench $common ARGS` into $out/NAME.json, its
# log beside it, unless that file exists: a finished run is kept, a killed one (NAME.json.tmp) is redone.
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
