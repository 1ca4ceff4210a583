"""Decode attention over a cold KV cache: torch SDPA against the CPU bf16 kernel, as docs/speed.md states.

    python benchmarks/attention_bandwidth.py [--tokens 8000] [--layers 30]

SmolLM2's shape (9 query heads, 3 KV heads, head dim 64); one K/V buffer per layer, cycled through, so
the cache (about 180 MB at 8K) comes from memory rather than the CPU's caches. Prints JSON: ms per pass
over all layers and the KV read rate, for 1, 2 and 7 new tokens (a decode step, a short check, the
default 6 + 1 token check), for SDPA, the kernel's vector path and (where the CPU has AMX) its tile path."""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from triforce.kernels.attention import causal_tail_mask
from triforce.kernels.cpu import cpu_kernels


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=8000)
    p.add_argument("--layers", type=int, default=30)
    args = p.parse_args()
    ext = cpu_kernels()
    if ext is None:
        raise SystemExit("the CPU kernels are unavailable on this machine")
    s, layers = args.tokens, args.layers
    keys = torch.randn(layers, 3, s + 64, 64).bfloat16()
    values = torch.randn(layers, 3, s + 64, 64).bfloat16()
    kv_bytes = layers * 2 * 3 * s * 64 * 2
    report = {}
    for n in (1, 2, 7):
        q = torch.randn(9, n, 64).bfloat16()
        mask = causal_tail_mask(n, s, "cpu").repeat(3, 1) if n > 1 else None

        def sdpa():
            for layer in range(layers):
                F.scaled_dot_product_attention(q.reshape(1, 3, 3 * n, 64), keys[layer, :, :s][None],
                                               values[layer, :, :s][None], attn_mask=mask, scale=0.125)

        def kernel(amx: bool):
            for layer in range(layers):
                ext.decode_attention_bf16(q, keys[layer, :, :s], values[layer, :, :s], 0.125, allow_amx=amx)

        paths = [("sdpa", sdpa), ("vector", lambda: kernel(False))]
        if ext.amx_usable():
            paths.append(("amx", lambda: kernel(True)))
        for name, fn in paths:
            fn()
            best = float("inf")
            for _ in range(5):
                start = time.perf_counter()
                fn()
                best = min(best, time.perf_counter() - start)
            report[f"{name}_n{n}"] = {"ms": round(best * 1e3, 2), "gb_per_s": round(kv_bytes / best / 1e9, 1)}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
