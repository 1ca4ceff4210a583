# Sourced by benchmarks/results/*/run.sh, which set $out (their folder) and $common (the bench arguments
# every run shares). `resumable NAME ARGS...` runs `triforce bench $common ARGS` into $out/NAME.json, its
# log beside it, unless that file exists: a finished run is kept, a killed one (NAME.json.tmp) is redone.
resumable() {
  local file=$out/$1.json; shift
  [ -f "$file" ] || { triforce bench $common "$@" --out "$file.tmp" > "$file.log" 2>&1 && mv "$file.tmp" "$file"; }
}
