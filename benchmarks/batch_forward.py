"""What one target forward of a batch costs: B sequences of n new tokens each over their own full KV
caches of --context random entries, against B = 1 (the weights read once for the whole batch, each
sequence's KV read for its own rows), through the fused layer loop and the layer-by-layer loop.

    python benchmarks/batch_forward.py [--context 7936] [--batch 1 4 8] [--tokens 1 3 7] [--reps 7]
                                       [--fused-only]

SmolLM2 in bfloat16; --reps rounds, each timing every point once, path by path (the order of the points
reversed every other round), so a slow spell of a shared machine falls on every point rather than on one
(these machines move their speed by half within minutes: compare points within a run). Prints JSON: the
median and best ms per forward by (batch, tokens) and path, and ms per sequence."""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from triforce.cache.full import FullKVCache
from triforce.kernels.cpu import isa_level
from triforce.models.hub import resolve_model
from triforce.models.loader import load_model
from triforce.step import Step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--context", type=int, default=7936)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4, 8])
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 3, 7])
    p.add_argument("--reps", type=int, default=7, help="rounds over every point (after one that warms up)")
    p.add_argument("--fused-only", action="store_true", help="time the fused layer loop only")
    args = p.parse_args()
    model = load_model(resolve_model("smollm2"), "bfloat16", torch.device("cpu"))
    caches = [FullKVCache(model.config, args.context + max(args.tokens), model.dtype, "cpu")
              for _ in range(max(args.batch))]
    for cache in caches:
        cache.keys.normal_()
        cache.values.normal_()
    fused_layers = model.fused_layers
    paths = (("fused", fused_layers),) if args.fused_only else (("fused", fused_layers), ("layer_loop", None))
    points = [(b, n) for b in args.batch for n in args.tokens]
    times = {(point, name): [] for point in points for name, _ in paths}
    for rep in range(args.reps + 1):
        for b, n in points if rep % 2 == 0 else points[::-1]:
            for name, path in paths:
                model.fused_layers = path
                steps = [Step.chain(torch.randint(0, model.config.vocab_size, (n,)), args.context) for _ in range(b)]
                for cache in caches:
                    cache.length = args.context
                start = time.perf_counter()
                model.forward_batch(steps, caches[:b])
                if rep:  # the first round warms up
                    times[(b, n), name].append(time.perf_counter() - start)
    rows = []
    for b, n in points:
        row = {"batch": b, "tokens": n}
        for name, _ in paths:
            row[f"{name}_ms"] = round(1000 * statistics.median(times[(b, n), name]), 2)
            row[f"{name}_best_ms"] = round(1000 * min(times[(b, n), name]), 2)
        row["fused_ms_per_sequence"] = round(row["fused_ms"] / b, 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    model.fused_layers = fused_layers
    print(json.dumps({"context": args.context, "isa_level": isa_level(), "results": rows}, indent=1))


if __name__ == "__main__":
    main()
