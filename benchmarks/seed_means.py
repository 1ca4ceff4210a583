"""Mode auto against a fixed mode over many seeds: `triforce bench` JSON files named LABEL_..._seedN.json
(benchmarks/results/issue12/auto_gammas/run.sh writes them), grouped by LABEL and each row's prompt length,
temperature and batch (files of several lengths under one label, or a file of several groups, apart).

    python benchmarks/seed_means.py FILE.json [FILE.json ...] [--against triforce|best]

At a temperature above 0 auto samples another text than the fixed mode does, and a run's speed follows its
text, so one seed's ratio says little (0.64x to 1.29x here). Prints per label: the seeds, each mode's mean
tokens/s, and auto against the fixed mode: the geometric mean of the per-seed ratios and their range, and
the ratio of the means. `--against best`: the fixed mode with the highest mean over the seeds (the point's
best fixed mode; against each seed's best of several noisy runs auto would face the larger of them, which
overstates every mode's mean). A file of a `--sweep` names its runs by the setting too (`triforce tree1=4`),
and every such run is put against `--against` (one of those names)."""
from __future__ import annotations

import argparse
import json
import math
import re
from collections import defaultdict
from pathlib import Path


def run_name(report: dict, row: dict) -> str:
    """A bench row's mode, with its setting where the bench swept one (`triforce tree1=4`)."""
    setting = (report.get("sweep") or {}).get("setting")
    return f"{row['run']} {setting}={row[setting]}" if setting and setting in row else row["run"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--against", default="triforce", help="a fixed mode, or best (the one with the highest mean)")
    args = p.parse_args()
    runs: dict = defaultdict(dict)  # (label, prompt, temperature, batch) -> seed -> {mode: tokens/s}
    for path in args.files:
        found = re.match(r"(.+?)_.*seed(\d+)\.json$", path.name)
        if found:
            report = json.load(open(path))
            for r in report["results"]:  # a file's groups (and files of other lengths) apart
                by_mode = runs[found[1], r["prompt_tokens"], r["temperature"], r.get("batch", 1)].setdefault(
                    int(found[2]), {})
                name = run_name(report, r)
                if name in by_mode:
                    raise SystemExit(f"{path}: a second {name!r} row for seed {found[2]} in one group")
                by_mode[name] = r["tokens_per_s"]
    for (label, prompt, temperature, batch), seeds in sorted(runs.items()):
        label = f"{label} prompt={prompt} T={temperature}" + (f" batch={batch}" if batch > 1 else "")
        modes = sorted({m for by_mode in seeds.values() for m in by_mode})
        means = {m: round(sum(s[m] for s in seeds.values() if m in s) / sum(m in s for s in seeds.values()), 1)
                 for m in modes}
        fixed = [m for m in modes if m != "auto"]  # `ar` too: the best fixed mode at 0.6 on AVX2 CPUs
        against = max(fixed, key=means.get, default=None) if args.against == "best" else args.against
        compared = ["auto"] if "auto" in modes else [m for m in modes if m != against and "=" in m]
        report = {"label": label, "seeds": sorted(seeds), "mean_tokens_per_s": means}
        for m in compared:
            ratios = [s[m] / s[against] for s in seeds.values() if m in s and against in s]
            if ratios:
                report[f"{m}_over_{against}".replace(" ", "_")] = {
                    "geometric_mean": round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 3),
                    "range": [round(min(ratios), 2), round(max(ratios), 2)],
                    "ratio_of_means": round(means[m] / means[against], 3)}
        print(json.dumps(report))


if __name__ == "__main__":
    main()
