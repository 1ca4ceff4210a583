"""The output head of a batch's check: logits of n rows of SmolLM2's head (49,152 x 576, bfloat16) through
the CPU linear kernel (float32 sums out) and through the path logits_linear takes past the kernel's rows
(the weights widened to float32 a block at a time, then torch's product), the two taking turns.

    python benchmarks/head_rows.py [--rows 11 40 64 88 128] [--reps 10]

Prints a JSON line per row count: the median ms of each and kernel / float32 path. A batch of 8 whose
target checks 11 tokens each asks for 88 rows."""
from __future__ import annotations

import argparse
import json
import time

import torch

from triforce.kernels import linear
from triforce.kernels.cpu import isa_level


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[11, 40, 64, 88, 128])
    p.add_argument("--reps", type=int, default=10)
    args = p.parse_args()
    weight = torch.randn(49152, 576).bfloat16()
    for n in args.rows:
        x = torch.randn(n, 576).bfloat16()
        paths = {"kernel": lambda: linear._kernel_linear(x, weight, float_out=True),
                 "float32": lambda: linear._float32_linear(x, weight)}
        times: dict[str, list[float]] = {name: [] for name in paths}
        for rep in range(args.reps + 1):
            for name in (list(paths) if rep % 2 else list(paths)[::-1]):
                start = time.perf_counter()
                paths[name]()
                if rep:  # the first of each warms up
                    times[name].append(time.perf_counter() - start)
        median = {k: sorted(v)[len(v) // 2] * 1e3 for k, v in times.items()}
        print(json.dumps({"level": isa_level(), "rows": n, **{f"{k}_median_ms": round(v, 2) for k, v in median.items()},
                          "kernel_over_float32": round(median["kernel"] / median["float32"], 3)}), flush=True)


if __name__ == "__main__":
    main()
