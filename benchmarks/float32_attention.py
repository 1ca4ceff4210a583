"""Float32 decode attention: the CPU kernel (csrc/attention_f32.cpp) against torch's paths.

    python benchmarks/float32_attention.py     # prints JSON: ms for SmolLM2's 30 layers, by keys and new tokens

SmolLM2-shaped attention (9 query heads, 3 KV heads, head dim 64, a K/V buffer per layer so a long cache
comes from memory) through `triforce.kernels.attention.attention`, best of 7, with the kernel and with
it turned off (torch's SDPA for one token, its masked or split passes for a check). The kernel sums a
check's rows as one-token steps sum them (benchmarks/check_rows.py --dtype float32); torch's paths do
not. On the 2-core AVX2 EPYC (results/check_rows/float32_attention.jsonl) the kernel took 0.39-0.68x
torch's time at 2,000 and 8,000 keys, 1 to 8 new tokens.
"""
import json
import time

import torch

import triforce.kernels.attention as attention_module
from triforce.kernels.cpu import cpu_model, kernel_path

LAYERS = 30


def best_ms(fn, repeats: int = 7) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return round(min(times) * 1e3, 2)


def main() -> None:
    for keys in (2000, 8000):
        ks = [torch.randn(3, keys, 64) for _ in range(LAYERS)]
        vs = [torch.randn(3, keys, 64) for _ in range(LAYERS)]
        for new in (1, 5, 8):
            q = torch.randn(9, new, 64)

            def one_pass():
                for k, v in zip(ks, vs):
                    attention_module.attention(q, k, v, 0.125)

            kernel = best_ms(one_pass)
            saved = attention_module.kernel_max_rows
            attention_module.kernel_max_rows = lambda: 0
            try:
                torch_ms = best_ms(one_pass)
            finally:
                attention_module.kernel_max_rows = saved
            print(json.dumps({"cpu": cpu_model(), "kernels": kernel_path(), "keys": keys, "new_tokens": new,
                              "kernel_ms": kernel, "torch_ms": torch_ms,
                              "kernel_over_torch": round(kernel / torch_ms, 3)}), flush=True)


if __name__ == "__main__":
    main()
