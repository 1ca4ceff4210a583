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
