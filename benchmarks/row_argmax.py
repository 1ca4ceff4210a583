"""torch's argmax over rows of a vocabulary against `row_argmax` (speculation/sampling.py), and a greedy
row's one-hot distribution made from each, in turns in one process.

    python benchmarks/row_argmax.py [--vocab 49152] [--rows 1 5 12] [--reps 400]

Prints a JSON line per row count: median microseconds of each."""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from triforce.speculation.sampling import probabilities, row_argmax


def one_hot_by_torch_max(logits: torch.Tensor) -> torch.Tensor:
    """A greedy row as `probabilities` made it before row_argmax (torch's max with indices)."""
    top = logits.max(dim=-1, keepdim=True)
    rows = torch.zeros_like(logits).scatter_(-1, top.indices, 1.0)
    return rows.masked_fill_(top.values.isnan() | top.values.isposinf(), float("nan"))


def median_us(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return round(1e6 * statistics.median(times), 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=49152, help="row width (SmolLM2's vocabulary by default)")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 5, 12])
    p.add_argument("--reps", type=int, default=400)
    args = p.parse_args()
    for n in args.rows:
        logits = torch.randn(n, args.vocab, generator=torch.Generator().manual_seed(n))
        assert torch.equal(row_argmax(logits), logits.argmax(dim=-1))
        cases = {"torch_argmax": lambda: logits.argmax(dim=-1), "row_argmax": lambda: row_argmax(logits),
                 "greedy_row_torch_max": lambda: one_hot_by_torch_max(logits),
                 "greedy_row": lambda: probabilities(logits, 0.0)}
        for fn in cases.values():  # warm up
            fn()
        result = {name: [] for name in cases}
        for _ in range(5):  # in turns, so that the machine's drift falls on all alike
            for name, fn in cases.items():
                result[name].append(median_us(fn, args.reps // 5))
        print(json.dumps({"rows": n, "vocab": args.vocab, "threads": torch.get_num_threads(),
                          **{f"{name}_us": statistics.median(v) for name, v in result.items()}}))


if __name__ == "__main__":
    main()
