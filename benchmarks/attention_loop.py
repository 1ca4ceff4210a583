"""Passes of SmolLM2-shaped decode attention (30 layers, 9 query heads, 3 KV heads, head dim 64, bfloat16)
with the installed CPU kernels, for a while: a steady process to profile with perf, which attaching to a
kernel_ab.py run did not give (its builds compile first, then its passes end within seconds).

    python benchmarks/attention_loop.py --new 11 --tokens 8000 --seconds 40 &
    sleep 8; perf record -a -e cpu-clock -- sleep 20
    perf annotate --stdio -d triforce_cpu_amx_<digest>.so 'triforce_attention::attend_range_amx<64>'

A K/V buffer per layer, so a long cache comes from memory as in a decode step. Prints the mean ms per pass.
TRIFORCE_CPU_ISA picks the kernel level as everywhere."""
from __future__ import annotations

import argparse
import time

import torch

from triforce.kernels.cpu import cpu_kernels, isa_level


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--new", type=int, default=1, help="new tokens (query rows per query head)")
    p.add_argument("--tokens", type=int, default=8000, help="cached keys")
    p.add_argument("--seconds", type=float, default=30.0, help="how long to run passes")
    args = p.parse_args()
    ext = cpu_kernels()
    if ext is None:
        raise SystemExit("the CPU kernels are unavailable on this machine")
    layers = 30
    keys, values = (torch.randn(layers, 3, args.tokens, 64, dtype=torch.bfloat16) for _ in range(2))
    q = torch.randn(9, args.new, 64, dtype=torch.bfloat16)
    passes, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        for layer in range(layers):
            ext.decode_attention_bf16(q, keys[layer], values[layer], 0.125, allow_amx=isa_level() == "amx", mask=None)
        passes += 1
    print(f"{isa_level()}: {(time.perf_counter() - start) / passes * 1e3:.2f} ms per pass of {args.new} new tokens "
          f"over {args.tokens} keys ({passes} passes)")


if __name__ == "__main__":
    main()
