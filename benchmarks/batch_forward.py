"""What one target forward of a batch costs: B sequences of n new tokens each over their own full KV
caches of --context random entries, against B = 1 (the weights read once for the whole batch, each
sequence's KV read for its own rows), through the fused layer loop and the layer-by-layer loop.

    python benchmarks/batch_forward.py [--context 7936] [--batch 1 4 8] [--tokens 1 3 7]

SmolLM2 in bfloat16; median of 7 forwards per point, the two paths alternating. Prints JSON: ms per
forward by (batch, tokens) and path, and ms per sequence."""
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
    args = p.parse_args()
    model = load_model(resolve_model("smollm2"), "bfloat16", torch.device("cpu"))
    caches = [FullKVCache(model.config, args.context + max(args.tokens), model.dtype, "cpu")
              for _ in range(max(args.batch))]
    for cache in caches:
        cache.keys.normal_()
        cache.values.normal_()
    fused_layers = model.fused_layers
    rows = []
    for b in args.batch:
        for n in args.tokens:
            times = {"fused": [], "layer_loop": []}
            for _ in range(7):
                for name, path in (("fused", fused_layers), ("layer_loop", None)):
                    model.fused_layers = path
                    steps = [Step.chain(torch.randint(0, model.config.vocab_size, (n,)), args.context)
                             for _ in range(b)]
                    for cache in caches:
                        cache.length = args.context
                    start = time.perf_counter()
                    model.forward_batch(steps, caches[:b])
                    times[name].append(time.perf_counter() - start)
            row = {"batch": b, "tokens": n,
                   **{f"{k}_ms": round(1000 * statistics.median(v), 2) for k, v in times.items()}}
            row["fused_ms_per_sequence"] = round(row["fused_ms"] / b, 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
    model.fused_layers = fused_layers
    print(json.dumps({"context": args.context, "isa_level": isa_level(), "results": rows}, indent=1))


if __name__ == "__main__":
    main()
