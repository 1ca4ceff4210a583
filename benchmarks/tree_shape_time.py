"""Sequoia's tree-shape search (speculation/tree_shape.py) against another revision's: the same shapes on
random cases, and the time of one auto-size decision (pick_size over check sizes up to 64 nodes, as
`--tree1 auto` makes after 4, 8 and 16 checks and then every 32). Prints one JSON line per rate vector.

    python benchmarks/tree_shape_time.py --base c3b25f9 [--cases 300] [--reps 5]"""
import argparse
import importlib.util
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from triforce.kernels.cpu import cpu_model
from triforce.speculation import tree_shape

CHECK = {n: 0.02 + 0.0003 * n for n in (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64)}  # seconds by tokens
LEVEL = {1: 0.002, 2: 0.002, 4: 0.002, 8: 0.003, 16: 0.004, 32: 0.005}
RATES = {"prior": [0.5, 0.15, 0.07, 0.04, 0.02, 0.01, 0.01, 0.01],
         "greedy": [0.86, 0.04, 0.07, 0.03, 0.0, 0.0, 0.0, 0.0]}


def load_base(rev: str, folder: Path):
    source = subprocess.run(["git", "show", f"{rev}:triforce/speculation/tree_shape.py"], check=True,
                            capture_output=True, text=True).stdout
    path = folder / "base_tree_shape.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("base_tree_shape", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def fields(shape) -> tuple:
    return shape.parents, shape.expected_tokens, shape.depth


def differing(base, cases: int) -> int:
    """Random rates (some zero, sums up to 1), sizes and depth bounds where the two disagree."""
    rng, bad = random.Random(0), 0
    for _ in range(cases):
        raw = [rng.random() ** rng.choice([1, 3]) for _ in range(rng.randint(1, 8))]
        if rng.random() < 0.3:
            raw[rng.randrange(len(raw))] = 0.0
        total = sum(raw) * rng.uniform(1.0, 2.0) or 1.0
        rates, nodes = [r / total for r in raw], rng.randint(0, 40)
        depth = rng.choice([None, 1, 2, 5, 8])
        bad += fields(base.best_tree(rates, nodes, depth)) != fields(tree_shape.best_tree(rates, nodes, depth))
        check = {n: 1 + 0.05 * n + rng.random() * 0.01 for n in (1, 2, 4, 8, 16, 32, 41) if n <= nodes + 1}
        if any(n > 1 for n in check):
            level = {1: 0.1, 4: 0.15, 16: 0.2}
            bad += fields(base.pick_size(rates, check, level)) != fields(tree_shape.pick_size(rates, check, level))
    return bad


def best_seconds(module, rates, reps: int) -> float:
    module.pick_size(rates, CHECK, LEVEL)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        module.pick_size(rates, CHECK, LEVEL)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="the git revision to compare with")
    p.add_argument("--cases", type=int, default=300, help="random cases whose shapes are compared")
    p.add_argument("--reps", type=int, default=5, help="timed decisions of each (the best is kept)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = load_base(args.base, Path(tmp))
        bad = differing(base, args.cases)
        for name, rates in RATES.items():
            old, new = best_seconds(base, rates, args.reps), best_seconds(tree_shape, rates, args.reps)
            print(json.dumps({"cpu": cpu_model(), "base": args.base, "rates": name, "cases": args.cases,
                              "differing_shapes": bad, "base_ms": round(old * 1e3, 2), "new_ms": round(new * 1e3, 2),
                              "new_over_base": round(new / old, 3)}))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
