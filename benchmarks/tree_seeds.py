"""Tree sizes against the chain over several sample paths: one `triforce bench --sweep tree1=...` (or
tree2, gamma1, gamma2, budget) JSON per seed, as benchmarks/results/issue11/amx_takeall/run.sh writes
them. The baseline is the sweep's first value (0, the chain, for tree sizes).

    python benchmarks/tree_seeds.py FILE.json [FILE.json ...]

At a temperature above 0 the path a seed samples decides how often the tiers agree, so one seed's ratio
says little (0.83x to 1.38x for one tree); this prints, per temperature and tree size, the ratio of the
summed decode time of the chain to the tree's over the same seeds (the speedup of running them all), the
range of the per-seed ratios, and the mean accepted length per check of the tier the tree is checked by."""
from __future__ import annotations

import json
import sys
from collections import defaultdict

SETTINGS = ("tree1", "tree2", "gamma1", "gamma2", "budget")  # the swept setting, found in each run's row


def main(paths: list[str]) -> None:
    seconds: dict = defaultdict(dict)  # (temperature, size) -> {file: seconds per token}
    accepted: dict = defaultdict(list)
    setting = None
    first: dict = {}  # per temperature: the sweep's first value, the baseline (the chain for tree sizes)
    reports = {path: json.load(open(path)) for path in paths}
    rows = [(path, r) for path in paths for r in reports[path]["results"]]
    modes = {r["run"] for _, r in rows} - {"ar"}  # several (a budget sweep beside `draft`): each value named by mode
    checkers = set()
    for path, r in rows:
        if r["run"] == "ar":
            size = "ar"
        else:
            # the swept setting as the report names it (a row also holds a fixed --tree1's value, which was
            # taken for the sweep's, merging a gamma1 sweep into one row), else the first the row holds
            setting = swept(reports[path]) or next(k for k in SETTINGS if k in r)
            size = r[setting] if len(modes) == 1 else f"{r['run']} {r[setting]}"
            first.setdefault(r["temperature"], size)
            # the tier whose checks the setting shapes: the draft's checker for its own settings, else the target
            tier = r["tiers"][0] if setting in ("tree1", "gamma1") else r["tiers"][-1]
            checkers.add(tier["name"])
            accepted[(r["temperature"], size)].append(tier["mean_accepted_length"])
        seconds[(r["temperature"], size)][path] = 1 / r["tokens_per_s"]
    for temperature in sorted({t for t, _ in seconds}):
        sizes = [s for t, s in seconds if t == temperature and s != "ar"]
        chain = seconds[(temperature, first[temperature])]
        print(f"\n#### {setting} at temperature {temperature} ({len(chain)} bench run(s), one per seed)\n")
        print(f"| {setting} | tokens/s | over {setting} {first[temperature]} | per path | over `ar` | accepted per "
              f"{' / '.join(sorted(checkers))} check |")
        print("|---|---|---|---|---|---|")
        for size in sorted(sizes, key=lambda s: (isinstance(s, str), s)):
            own = seconds[(temperature, size)]
            common = [p for p in own if p in chain]
            if not common:  # (runs of another file than the baseline's: compare runs of one bench each)
                print(f"| {size} | {len(own) / sum(own.values()):.1f} | no run beside the baseline's | | | |")
                continue
            ar = seconds[(temperature, "ar")]
            ratios = sorted(chain[p] / own[p] for p in common)
            mean_acc = sum(accepted[(temperature, size)]) / len(accepted[(temperature, size)])
            with_ar = [p for p in common if p in ar]  # (runs without `ar` leave its column blank)
            over_ar = f"{sum(ar[p] for p in with_ar) / sum(own[p] for p in with_ar):.2f}x" if with_ar else ""
            print(f"| {size} | {len(own) / sum(own.values()):.1f} | {sum(chain[p] for p in common) / sum(own[p] for p in common):.2f}x "
                  f"| {ratios[0]:.2f}-{ratios[-1]:.2f}x | {over_ar} | {mean_acc:.2f} |")


def swept(report: dict) -> str | None:
    """The setting a bench report swept: its `sweep` field, or older reports' --sweep in their argv."""
    if report.get("sweep"):
        return report["sweep"]["setting"]
    argv = report.get("argv", [])
    spec = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--sweep"), None)
    return spec.split("=")[0] if spec else None


if __name__ == "__main__":
    main(sys.argv[1:])
