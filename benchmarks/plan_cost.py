"""What one plan of `--mode auto`'s planner costs in Python, on given forward costs (tests/given_costs.py):
20 plans each at three check-cost slopes over a 16K context, budget 2048.

    python benchmarks/plan_cost.py [--out plans.json]

Prints JSON: ms per plan by slope; --out writes every decision and plan, to compare two commits' choices
(a change meant only to make planning cheaper must leave them as they were)."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from given_costs import planner_with  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out")
    args = p.parse_args()
    report, choices = {}, []
    for slope in (0.002, 0.01, 0.03):  # seconds per extra token of a target check (one token: 0.05)
        target = {n: 0.05 + slope * (n - 1) for n in (1, 2, 4, 6, 8, 12, 16)}
        costs = {"draft": {1: 0.006, 4: 0.009}, "retrieval": {n: 0.02 + 0.004 * n for n in target}, "target": target}
        planner = planner_with(costs, budget=2048)
        planner.plan(16000, 0)
        start = time.perf_counter()
        plans = [planner.plan(16000 + 9 * i, 9 * i) for i in range(20)]
        report[str(slope)] = round((time.perf_counter() - start) / 20 * 1e3, 2)
        choices.append({"decisions": planner.decisions, "plans": [repr(plan) for plan in plans]})
    if args.out:
        Path(args.out).write_text(json.dumps(choices, sort_keys=True, default=str))
    print(json.dumps({"ms_per_plan": report}))


if __name__ == "__main__":
    main()
