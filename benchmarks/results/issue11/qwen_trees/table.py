"""run.sh's trees against its chains at 0.6, matched by seed (one bench per seed and sweep, so
benchmarks/tree_seeds.py, which matches runs within a file, cannot join them): tokens/s over the seeds
both ran and the ratio to the chain of gamma1 1, summed and per seed.

    python benchmarks/results/issue11/qwen_trees/table.py benchmarks/results/issue11/qwen_trees/LABEL
"""
import glob
import json
import os
import sys
from collections import defaultdict


def main(folder: str) -> None:
    seconds = defaultdict(dict)  # (kind, size) -> {seed: seconds per token}
    accepted = defaultdict(dict)  # (kind, size) -> {seed: mean accepted length per check}
    for path in sorted(glob.glob(f"{folder}/sampled_seed*.json") + glob.glob(f"{folder}/chains_seed*.json")):
        report = json.load(open(path))
        for r in report["results"]:
            tree = r.get("tree1") or 0
            chains = os.path.basename(path).startswith("chains_")  # (else the chain is run.sh's gamma1)
            key = ("tree", tree) if tree else ("chain", r.get("gamma1") if chains else report["engine"]["gamma1"])
            seconds[key][report["seed"]] = 1 / r["tokens_per_s"]
            accepted[key][report["seed"]] = r["tiers"][0]["mean_accepted_length"]
    seeds = sorted(set.intersection(*(set(v) for v in seconds.values())))
    base = seconds[("chain", 1)]
    print(f"temperature 0.6, seeds {seeds}\n\n| proposals | tokens/s | over a chain of 1 | per seed | accepted per check |")
    print("|---|---|---|---|---|")
    order = sorted(seconds, key=lambda k: (k[0], isinstance(k[1], str), k[1]))  # chains, then trees; sizes as numbers
    for kind, size in order:
        by_seed = seconds[(kind, size)]
        total = sum(by_seed[s] for s in seeds)
        per_seed = ", ".join(f"{base[s] / by_seed[s]:.2f}" for s in seeds)
        mean = sum(accepted[(kind, size)][s] for s in seeds) / len(seeds)
        print(f"| {kind} {size} | {len(seeds) / total:.2f} | {sum(base[s] for s in seeds) / total:.2f}x | {per_seed} "
              f"| {mean:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1])
