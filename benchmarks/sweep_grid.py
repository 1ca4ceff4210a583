"""A `triforce bench --sweep SETTING=...` report as one table per temperature: a row per batch size, with
`ar`'s tokens/s and each value's tokens/s, its ratio to `ar` and to the sweep's first value (medians where
the bench ran --repeats). Target checks per request and their tokens from the runs' metrics.

    python benchmarks/sweep_grid.py benchmarks/results/issue12/amx3/rounds2_sweep.json rounds2
"""
import json
import sys


def main() -> None:
    report, setting = json.load(open(sys.argv[1])), sys.argv[2]
    rows = report["results"]
    values = list(dict.fromkeys(r[setting] for r in rows if setting in r))
    for temperature in sorted({r["temperature"] for r in rows}):
        print(f"### {setting}, temperature {temperature}\n")
        print("| batch | `ar` tok/s | " + " | ".join(f"{setting} {v}" for v in values) + " |")
        print("|---" * (len(values) + 2) + "|")
        for batch in sorted({r["batch"] for r in rows}):
            at = [r for r in rows if r["temperature"] == temperature and r["batch"] == batch]
            ar = next(r for r in at if r["run"] == "ar")["tokens_per_s"]
            runs = [next(r for r in at if r.get(setting) == v and r["run"] != "ar") for v in values]
            cells = []
            for r in runs:
                target = next((t for t in r["tiers"] if t["name"] == "target"), None)
                checks = f", {target['checks'] / batch:.1f} target checks of {target['proposed_per_check']:.1f}" \
                    if target else ""
                cells.append(f"{r['tokens_per_s']:.1f} ({r['tokens_per_s'] / ar:.2f}x ar, "
                             f"{r['tokens_per_s'] / runs[0]['tokens_per_s']:.2f}x first{checks})")
            print(f"| {batch} | {ar:.1f} | " + " | ".join(cells) + " |")
        print()


if __name__ == "__main__":
    main()
