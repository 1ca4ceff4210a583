"""A change to the CPU kernels against a base revision, timed as whole SmolLM2 forwards through the fused
layer loop (kernels/decoder.py): one sequence or a batch, a decode step or a check, both builds in one
process taking turns.

    python benchmarks/decoder_ab.py [--base HEAD] [--points 8x11@7936 8x5@640 ...]

Builds this CPU's level of `triforce/kernels/csrc/` from the base revision and from the working tree
(kernel_ab.py's builds), and times model.forward_batch of B sequences of n new tokens over full KV caches
of `context` random entries (bfloat16), logits of every row, with each build's kernels in turn (the order
swapped every repetition). Prints a JSON line per point: median ms of each build and new / base. Compare
builds within one run only: these shared machines move 20-30% between runs."""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

import triforce.kernels.decoder as decoder
import triforce.kernels.linear as linear
from triforce.cache.full import FullKVCache
from triforce.kernels import build as kernel_build
from triforce.kernels import cpu
from triforce.models.hub import resolve_model
from triforce.models.loader import load_model
from triforce.step import Step

from kernel_ab import base_sources, build

POINTS = ["1x1@7936", "1x11@7936", "8x1@7936", "8x11@7936", "8x5@640", "8x5@2600", "4x5@2600", "8x1@300"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", default="HEAD", help="the git revision to compare with (default HEAD)")
    p.add_argument("--points", nargs="+", default=POINTS, help="BATCHxTOKENS@CONTEXT each")
    p.add_argument("--reps", type=int, default=10, help="timed forwards of each build per point")
    args = p.parse_args()
    level = cpu.isa_level()
    with tempfile.TemporaryDirectory() as tmp:
        base = build(f"triforce_dec_base_{level}", base_sources(args.base, Path(tmp)), level)
    new = build(f"triforce_dec_new_{level}", kernel_build.CSRC, level)
    points = [tuple(int(v) for v in point.replace("@", "x").split("x")) for point in args.points]
    model = load_model(resolve_model("smollm2"), "bfloat16", torch.device("cpu"))
    caches = [FullKVCache(model.config, max(c + n for _, n, c in points), model.dtype, "cpu")
              for _ in range(max(b for b, _, _ in points))]
    for cache in caches:
        cache.keys.normal_()
        cache.values.normal_()
    for b, n, context in points:
        times: dict[str, list[float]] = {"base": [], "new": []}
        for rep in range(args.reps + 1):
            builds = [("base", base), ("new", new)]
            for name, ext in builds if rep % 2 else builds[::-1]:
                decoder.cpu_kernels = linear.cpu_kernels = lambda ext=ext: ext  # the layer loop's and the head's
                for cache in caches:
                    cache.length = context
                steps = [Step.chain(torch.randint(0, model.config.vocab_size, (n,)), context) for _ in range(b)]
                start = time.perf_counter()
                model.forward_batch(steps, caches[:b])
                if rep:  # the first forward of each warms up
                    times[name].append(time.perf_counter() - start)
        median = {k: sorted(v)[len(v) // 2] * 1e3 for k, v in times.items()}
        print(json.dumps({"level": level, "batch": b, "tokens": n, "context": context,
                          **{f"{k}_median_ms": round(v, 1) for k, v in median.items()},
                          "new_over_base": round(median["new"] / median["base"], 3)}), flush=True)


if __name__ == "__main__":
    main()
