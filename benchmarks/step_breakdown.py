"""Where one target forward spends its time: each kernel call site of the layer-by-layer loop timed in
place, the rest is Python, dispatch and small torch ops; then the same forward through the fused layer
loop (kernels/decoder.py), which the call-site timers cannot see into, as `fused_total`.

    python benchmarks/step_breakdown.py [--context 8000] [--tokens 1 7]

SmolLM2 in bfloat16 over a full KV cache of --context random entries; median of 10 forwards per token
count. Prints JSON: ms per call site summed over the layers, the total, `other` (total minus them) and
`fused_total`; the two totals alternate, forward by forward."""
from __future__ import annotations

import argparse
import collections
import json
import time

import torch

import triforce.models.llama as llama
from triforce.cache.full import FullKVCache
from triforce.models.hub import resolve_model
from triforce.models.loader import load_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--context", type=int, default=8000)
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 7])
    args = p.parse_args()
    spent: collections.Counter = collections.Counter()

    def timed(name, fn):
        def wrapper(*a, **k):
            start = time.perf_counter()
            out = fn(*a, **k)
            spent[name] += time.perf_counter() - start
            return out
        return wrapper

    for name in ("attention", "linear", "rms_norm", "silu_mul", "rope"):  # the names llama.py calls
        setattr(llama, name, timed(name, getattr(llama, name)))
    model = load_model(resolve_model("smollm2"), "bfloat16", torch.device("cpu"))
    for layer in model.layers:
        layer.o_proj.forward = timed("o_proj", layer.o_proj.forward)
        layer.down_proj.forward = timed("down_proj", layer.down_proj.forward)
    model.lm_head.forward = timed("lm_head", model.lm_head.forward)
    cache = FullKVCache(model.config, args.context + max(args.tokens), model.dtype, "cpu")
    cache.append = timed("cache.append", cache.append)
    cache.keys.normal_()
    cache.values.normal_()
    fused_layers = model.fused_layers
    report = {}
    for n in args.tokens:
        ids = torch.randint(0, model.config.vocab_size, (n,))
        runs, fused = [], []
        for _ in range(13):
            for path in (None, fused_layers):
                model.fused_layers = path
                spent.clear()
                cache.length = args.context
                start = time.perf_counter()
                model(ids, cache)
                elapsed = time.perf_counter() - start
                if path is None:
                    runs.append((elapsed, dict(spent)))
                else:
                    fused.append(elapsed)
        total, parts = sorted(runs, key=lambda r: r[0])[len(runs) // 2]  # the median forward
        row = {k: round(v * 1e3, 1) for k, v in sorted(parts.items(), key=lambda kv: -kv[1])}
        row["total"] = round(total * 1e3, 1)
        row["other"] = round((total - sum(parts.values())) * 1e3, 1)
        row["fused_total"] = round(sorted(fused)[len(fused) // 2] * 1e3, 1)
        report[f"n{n}"] = row
    print(json.dumps(report))


if __name__ == "__main__":
    main()
