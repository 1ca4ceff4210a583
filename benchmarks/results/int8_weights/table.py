"""Tables of run.sh's bench files: per file, temperature and mode, tokens/s with the tier's own weights and
with int8 (the swept setting), their ratio, and the acceptance of the int8 tier's proposals by its checker
each way; the mean of the ratios over the files given.

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
            own, int8 = rows[next(v for v in rows if v != "int8")], rows["int8"]

            def accepted(row):
                return next((t["acceptance_rate"] for t in row["tiers"] if t["drafter"].startswith(proposer)), None)

            ratio = int8["tokens_per_s"] / own["tokens_per_s"]
            ratios[mode, temperature, setting].append(ratio)
            print(f"| {path.rsplit('/', 1)[-1]} | {temperature} | {mode} | {own['tokens_per_s']:.1f} | "
                  f"{int8['tokens_per_s']:.1f} | {ratio:.2f}x | {accepted(own)} -> {accepted(int8)} | "
                  f"{ar.get(temperature, float('nan')):.1f} |")
    print()
    for (mode, temperature, setting), values in sorted(ratios.items()):
        print(f"{setting} {mode} T {temperature}: int8 / own {statistics.mean(values):.3f} over {len(values)} "
              f"(range {min(values):.2f}-{max(values):.2f})")


if __name__ == "__main__":
    main()
