"""The int8 linear kernel (csrc/linear_i8.cpp) against the bfloat16 one (csrc/linear_bf16.cpp) on SmolLM2's
30 layers' four matrices (random weights of their shapes), best of three timings of 30 passes, at each
count of rows of x: what a proposing tier's forward saves in its products (--retrieval-weights int8,
--draft-weights int8). Prints one JSON line per row count.

    python benchmarks/int8_linear.py [--rows 1 2 4 7 8 16]"""
import argparse
import json
import time

import torch

from triforce.kernels.cpu import cpu_model, kernel_path
from triforce.kernels.int8 import Int8Weight, int8_linear
from triforce.kernels.linear import linear

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30  # SmolLM2: qkv, o, gate_up, down


def best_ms(product, weights, rows: int, reps: int = 30) -> float:
    xs = [torch.randn(rows, k).bfloat16() for _, k in SHAPES]
    for _ in range(3):
        [product(x, w) for x, w in zip(xs, weights)]
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(reps):
            [product(x, w) for x, w in zip(xs, weights)]
        best = min(best, (time.perf_counter() - start) / reps * 1e3)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 7, 8, 16])
    args = p.parse_args()
    torch.manual_seed(0)
    bf16 = [torch.randn(n, k).bfloat16() for n, k in SHAPES]
    int8 = [Int8Weight.of(w) for w in bf16]
    for rows in args.rows:
        a, b = best_ms(linear, bf16, rows), best_ms(int8_linear, int8, rows)
        print(json.dumps({"cpu": cpu_model(), "kernel_path": kernel_path(), "rows": rows, "bf16_ms": round(a, 2),
                          "int8_ms": round(b, 2), "bf16_over_int8": round(a / b, 2)}))


if __name__ == "__main__":
    main()
