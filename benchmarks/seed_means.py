"""Mode auto against a fixed mode over many seeds: `triforce bench` JSON files named LABEL_..._seedN.json
(benchmarks/results/issue12/auto_gammas/run.sh writes them), grouped by LABEL.

    python benchmarks/seed_means.py FILE.json [FILE.json ...] [--against triforce]

At a temperature above 0 auto samples another text than the fixed mode does, and a run's speed follows its
text, so one seed's ratio says little (0.64x to 1.29x here). Prints per label: the seeds, each mode's mean
tokens/s, and auto against the fixed mode: the geometric mean of the per-seed ratios and their range."""
from __future__ import annotations

import argparse
import json
import math
import re
from collections import defaultdict
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--against", default="triforce")
    args = p.parse_args()
    runs: dict = defaultdict(dict)  # label -> seed -> {mode: tokens/s}
    for path in args.files:
        found = re.match(r"(.+?)_.*seed(\d+)\.json$", path.name)
        if found:
            rows = json.load(open(path))["results"]
            runs[found[1]][int(found[2])] = {r["run"]: r["tokens_per_s"] for r in rows}
    for label, seeds in sorted(runs.items()):
        modes = sorted({m for by_mode in seeds.values() for m in by_mode})
        means = {m: round(sum(s[m] for s in seeds.values() if m in s) / sum(m in s for s in seeds.values()), 1)
                 for m in modes}
        ratios = [s["auto"] / s[args.against] for s in seeds.values() if "auto" in s and args.against in s]
        if not ratios:
            print(json.dumps({"label": label, "seeds": sorted(seeds), "mean_tokens_per_s": means}))
            continue
        print(json.dumps({"label": label, "seeds": sorted(seeds), "mean_tokens_per_s": means,
                          f"auto_over_{args.against}": {
                              "geometric_mean": round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 3),
                              "range": [round(min(ratios), 2), round(max(ratios), 2)]}}))


if __name__ == "__main__":
    main()
