"""Tables of run.sh's bench files (and proposer_weights/run.sh's): per file, temperature and mode, tokens/s
with the tier's own weights and with int8 (or auto: the swept setting), their ratio, and the acceptance of the
tier's proposals by its checker each way; per file, mode auto against the best fixed mode at each swept
value; the mean of the ratios over the files given.

    python benchmarks/results/int8_weights/table.py benchmarks/results/int8_weights/zen4_*/smollm2_*.json"""
import json
import statistics
import sys
from collections import defaultdict


def main() -> None:
    ratios = defaultdict(list)
    print("| file | T | mode | own weights tok/s | int8 tok/s | int8 / own | acceptance own -> int8 | `ar` tok/s |")
    print("|---|---|---|---|---|---|---|---|")
    for path in sys.argv[1:]:
        report = json.load(open(path))
        setting = report["sweep"]["setting"]
        kinds = {"retrieval_weights": "retrieval", "draft_weights": "draft"}
        proposer = kinds[setting]
        groups = defaultdict(dict)
        ar = {}
        for row in report["results"]:
            key = row["temperature"]
            if row["run"] == "ar":
                ar[key] = row["tokens_per_s"]
                continue
            if setting in row:  # (a mode that does not run the swept tier ran once)
                groups[key, row["run"]][row[setting]] = row
        for (temperature, mode), rows in sorted(groups.items()):
            if len(rows) < 2:
                continue
            own = rows[next(v for v in rows if v in ("target", "draft"))]
            int8 = rows[next(v for v in rows if v not in ("target", "draft"))]  # (int8, or auto: run.sh's of
            # proposer_weights)

            def accepted(row):
                return next((t["acceptance_rate"] for t in row["tiers"] if t["drafter"].startswith(proposer)), None)

            ratio = int8["tokens_per_s"] / own["tokens_per_s"]
            ratios[mode, temperature, setting].append(ratio)
            print(f"| {path.rsplit('/', 1)[-1]} | {temperature} | {mode} | {own['tokens_per_s']:.1f} | "
                  f"{int8['tokens_per_s']:.1f} | {ratio:.2f}x | {accepted(own)} -> {accepted(int8)} | "
                  f"{ar.get(temperature, float('nan')):.1f} |")
        fixed = defaultdict(dict)  # (T, swept value): each fixed mode's tokens/s, `ar` and those run once too
        for row in report["results"]:
            if row["run"] != "auto":
                for value in ([row[setting]] if setting in row else {v for _, v in _values(groups)}):
                    fixed[row["temperature"], value][row["run"]] = row["tokens_per_s"]
        for (temperature, value), speeds in sorted(fixed.items()):
            auto = groups.get((temperature, "auto"), {}).get(value)
            if auto is not None:
                mode, top = max(speeds.items(), key=lambda kv: kv[1])
                print(f"  auto at {setting}={value} T {temperature}: {auto['tokens_per_s'] / top:.2f}x the best "
                      f"fixed mode ({mode}, {top:.1f} tok/s)")
    print()
    for (mode, temperature, setting), values in sorted(ratios.items()):
        print(f"{setting} {mode} T {temperature}: int8 / own {statistics.mean(values):.3f} over {len(values)} "
              f"(range {min(values):.2f}-{max(values):.2f})")


def _values(groups: dict) -> set:
    """(mode, swept value) of every row that ran the swept setting."""
    return {(mode, value) for (_, mode), rows in groups.items() for value in rows}


if __name__ == "__main__":
    main()
