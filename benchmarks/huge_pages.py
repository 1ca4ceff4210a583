"""Transparent huge pages for the KV cache and the weights: the CPU kernels over buffers advised with
madvise(MADV_HUGEPAGE) against plain ones, taking turns in one process.

    python benchmarks/huge_pages.py [--tokens 8000] [--new 1 4 7] [--reps 10]

SmolLM2's shapes: decode attention over 30 layers of K/V (9 query heads, 3 KV heads, head dim 64) and
the bfloat16 linears of its 30 layers, each set in one buffer, so both come from memory. Needs the kernel's
THP mode `madvise` or `always` (/sys/kernel/mm/transparent_hugepage/enabled); the JSON says how many
huge pages the advised buffers got. Prints a JSON line per kernel and row count: median ms of each and
huge / plain. triforce does not advise its buffers (docs/avx2.md: the gain measured small)."""
from __future__ import annotations

import argparse
import ctypes
import json
import time

import torch

from triforce.kernels.cpu import cpu_kernels

MADV_HUGEPAGE = 14
HUGE_PAGE = 2 << 20
LINEAR_SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))  # qkv, o, gate_up, down


def buffer(numel: int, advise: bool) -> torch.Tensor:
    """numel random bfloat16 values; the 2 MB pages inside it advised before they are first touched."""
    t = torch.empty(numel, dtype=torch.bfloat16)
    if advise:
        start = -(-t.data_ptr() // HUGE_PAGE) * HUGE_PAGE
        end = (t.data_ptr() + numel * 2) // HUGE_PAGE * HUGE_PAGE
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        if end > start and libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_HUGEPAGE):
            raise SystemExit(f"madvise failed: errno {ctypes.get_errno()}")
    t.copy_(torch.randn(numel))
    return t


def anon_huge_kb() -> int:
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("AnonHugePages"))


def timed(passes: dict, reps: int) -> dict:
    """Median seconds of each pass, the passes taking turns, the order swapped every repetition."""
    times = {name: [] for name in passes}
    for rep in range(reps + 1):
        for name in list(passes)[:: 1 if rep % 2 else -1]:
            start = time.perf_counter()
            passes[name]()
            if rep:  # the first of each warms up
                times[name].append(time.perf_counter() - start)
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=8000, help="cached keys")
    p.add_argument("--new", type=int, nargs="+", default=[1, 4, 7], help="new tokens (rows of x, query rows)")
    p.add_argument("--reps", type=int, default=10)
    args = p.parse_args()
    ext = cpu_kernels()
    if ext is None:
        raise SystemExit("the CPU kernels are unavailable on this machine")
    layers, s = 30, args.tokens
    kv, weights, huge = {}, {}, {}
    for name, advise in (("plain", False), ("huge", True)):
        before = anon_huge_kb()
        kv[name] = buffer(2 * layers * 3 * s * 64, advise).view(2, layers, 3, s, 64)
        flat, at, weights[name] = buffer(layers * sum(a * b for a, b in LINEAR_SHAPES), advise), 0, []
        for _ in range(layers):
            for a, b in LINEAR_SHAPES:
                weights[name].append(flat[at:at + a * b].view(a, b))
                at += a * b
        huge[name] = anon_huge_kb() - before
    for n in args.new:
        q = torch.randn(9, n, 64).bfloat16()
        xs = {k: torch.randn(n, k).bfloat16() for k in (576, 1536)}

        def attention(name):
            for layer in range(layers):
                ext.decode_attention_bf16(q, kv[name][0, layer], kv[name][1, layer], 0.125, allow_amx=False)

        def linears(name):
            for w in weights[name]:
                ext.linear_bf16(xs[w.shape[1]], w, float_out=False, allow_amx=False)

        for kernel, fn in (("attention", attention), ("linear", linears)):
            median = timed({name: (lambda name=name: fn(name)) for name in ("plain", "huge")}, args.reps)
            print(json.dumps({"kernel": kernel, "tokens": s if kernel == "attention" else None, "rows": n,
                              "threads": torch.get_num_threads(), "huge_pages_kb": huge,
                              **{f"{k}_ms": round(v * 1e3, 2) for k, v in median.items()},
                              "huge_over_plain": round(median["huge"] / median["plain"], 3)}), flush=True)


if __name__ == "__main__":
    main()
