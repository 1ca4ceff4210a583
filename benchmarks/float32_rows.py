"""Float32 forwards by the number of rows: what torch's float32 product cost before the float32 kernel.

    python benchmarks/float32_rows.py     # prints JSON: ms per forward and per linear, by rows

SmolLM2's forward of n = 1, 2, 4 and 8 tokens at 700 tokens of context, in float32 and bfloat16 (best
of 5), and torch's float32 linear on the output head's shape ([49152, 576], 113 MB) with the weight as
stored ([out, in], `F.linear`) and transposed ([in, out], `x @ w_t`), and triforce's `linear` (the
float32 kernel, csrc/linear_f32.cpp, up to KERNEL_MAX_ROWS rows). On the 2-core Zen 4 (2ca0cdd;
results/float32_rows/zen4.json) a float32 forward of 2 tokens cost 1.8x one of 1 (bfloat16 1.0x), and
`F.linear` ran at half the memory bandwidth at one row and worse at two, where `x @ w_t` ran at it.
With the float32 kernel (results/float32_rows/zen4_kernel.json) a forward of 1, 2, 4 and 8 tokens
cost 31, 33, 34 and 49 ms, against 65, 114, 94 and 95 in zen4.json before it (63, 104, 87 and 83 in a
run of that session not kept).
"""
import json
import time

import torch
import torch.nn.functional as F

from triforce.cache.full import FullKVCache
from triforce.kernels.cpu import cpu_model, kernel_path
from triforce.kernels.linear import linear as triforce_linear
from triforce.models.hub import fetch_model
from triforce.models.loader import load_model
from triforce.step import Step

ROWS = (1, 2, 4, 8)


def best_ms(fn, repeats: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return round(best * 1000, 2)


def forwards(dtype: str, context: int = 700) -> dict[int, float]:
    model = load_model(fetch_model("smollm2"), dtype)
    cache = FullKVCache(model.config, context + max(ROWS), model.dtype, model.device)
    ids = torch.randint(0, 1000, (context,), generator=torch.Generator().manual_seed(0)).tolist()
    model.forward(Step.chain(ids, 0), cache)

    def step(n):
        model.forward(Step.chain(ids[:n], context), cache)
        cache.truncate(context)

    return {n: best_ms(lambda: step(n)) for n in ROWS}


def main() -> None:
    torch.manual_seed(0)
    weight = torch.randn(49152, 576)
    transposed = weight.t().contiguous()
    linear = {}
    for n in ROWS:
        x = torch.randn(n, 576)
        linear[n] = {"F.linear_ms": best_ms(lambda: F.linear(x, weight), 10),
                     "x@w_t_ms": best_ms(lambda: x @ transposed, 10),
                     "triforce_linear_ms": best_ms(lambda: triforce_linear(x, weight), 10)}
    print(json.dumps({"cpu": cpu_model(), "kernels": kernel_path(), "threads": torch.get_num_threads(),
                      "head_linear_float32": linear,
                      "smollm2_forward_ms": {dtype: forwards(dtype) for dtype in ("float32", "bfloat16")}}, indent=1))


if __name__ == "__main__":
    main()
