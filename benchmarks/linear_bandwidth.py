"""Weight-read bandwidth of decode-sized bfloat16 linears: torch's path against triforce's CPU kernel
(its vector path, and its AMX tile path where the CPU has one).

    python benchmarks/linear_bandwidth.py     # prints JSON: GB/s per number of activation rows

60 distinct 3072x576 matrices (SmolLM2's gate/up shape, 212 MB in all) so the weights come from memory,
not cache; best of 5 passes. Rows of x: 1, 2, 4 to 8, 16, 24 and 32: a decode step, the checks of chains
(5: gamma1 4 and the next token) and batches of them.
"""
import json
import time

import torch
import torch.nn.functional as F

from triforce.kernels.cpu import cpu_kernels


def bandwidth(fn, weights) -> float:
    fn(weights[0])
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for w in weights:
            fn(w)
        best = min(best, time.perf_counter() - start)
    return round(sum(w.numel() * w.element_size() for w in weights) / best / 1e9, 2)


def main() -> None:
    weights = [torch.randn(3072, 576).bfloat16() for _ in range(60)]
    kernel = cpu_kernels()
    rows = {}
    for n in (1, 2, 4, 5, 6, 7, 8, 16, 24, 32):
        x = torch.randn(n, 576).bfloat16()
        rows[n] = {"torch_GBps": bandwidth(lambda w: F.linear(x, w), weights)}
        if kernel is not None:
            rows[n]["vector_kernel_GBps"] = bandwidth(lambda w: kernel.linear_bf16(x, w, allow_amx=False), weights)
        if kernel is not None and kernel.amx_usable():
            rows[n]["amx_kernel_GBps"] = bandwidth(lambda w: kernel.linear_bf16(x, w), weights)
    print(json.dumps({"threads": torch.get_num_threads(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
