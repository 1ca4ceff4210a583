"""How a proposer's acceptance depends on depth, from `triforce bench` JSON: per run and tier, the
chance that the k-th proposal of a check is accepted given the ones before it were, and the single
per-token alpha that mode auto's geometric model (coordinator/planning.py) fits to the same checks.

    python benchmarks/depth_acceptance.py FILE.json [FILE.json ...]

A geometric proposer has the same rate at every depth; a bursty one (right once, likely right again) has
rates that rise with depth, and then a fit from short chains underrates long ones.
"""
import json
import sys


def main(paths: list[str]) -> None:
    print("| file | T | run | setting | tier | checks | per depth: accepted given the ones before | geometric alpha |")
    print("|---|---|---|---|---|---|---|---|")
    for path in paths:
        for row in json.load(open(path))["results"]:
            setting = ", ".join(f"{k} {row[k]}" for k in ("gamma1", "gamma2", "tree1", "lookup") if k in row)
            bottom = "retrieval" if row["run"] == "retrieval" else "draft"
            tree = row.get("tree2" if bottom == "retrieval" else "tree1")
            for tier in row.get("tiers") or []:
                depths, checks = tier.get("accepted_per_depth"), tier["checks"]
                if (tree and tier.get("drafter") == bottom) or not depths or tier["proposed"] != checks * len(depths):
                    continue  # chains of one length only (trees, or checks of several sizes, mix depths)
                reached = [checks] + depths[:-1]
                rates = [a / r if r else 0.0 for a, r in zip(depths, reached)]
                stopped = checks - depths[-1]  # checks that met a rejection
                alpha = tier["accepted"] / (tier["accepted"] + stopped)
                print(f"| {path.split('/')[-1]} | {row['temperature']} | {row['run']} | {setting} | {tier['name']} | {checks} | "
                      f"{' / '.join(f'{r:.2f}' for r in rates)} | {alpha:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
