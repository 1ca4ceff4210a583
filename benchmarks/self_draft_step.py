"""What one step of each draft costs over its streaming cache, by batch size: SmolLM2's shipped draft
against `--draft self` (the target's own weights, and its int8 twin), the three taking turns step by step.

    python benchmarks/self_draft_step.py [--batch 1 2 4 8] [--steps 15]

bfloat16, sinks 16 + window 256 (the defaults), each sequence's cache filled by a prefill of 300 random
tokens; one-token steps of B sequences in one call (model.forward_batch, the fused layer loop), each rolled
back after. Prints a JSON line per batch size: the median ms of a step per draft.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from triforce.cache.streaming import StreamingKVCache
from triforce.llm_models import DEFAULT_DRAFTS
from triforce.models.hub import resolve_model
from triforce.models.loader import load_model
from triforce.models.quantized import int8_twin
from triforce.step import Step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--steps", type=int, default=15)
    args = parser.parse_args()
    target = load_model(resolve_model("smollm2"), "bfloat16", torch.device("cpu"))
    models = {"shipped": load_model(DEFAULT_DRAFTS["smollm2"], "bfloat16", torch.device("cpu")),
              "self": target, "self_int8": int8_twin(target, "draft")}
    caches = {}
    for name, model in models.items():
        caches[name] = [StreamingKVCache(model.config, 16, 256, 64, model.rope, model.dtype, "cpu")
                        for _ in range(max(args.batch))]
        for cache in caches[name]:
            model(torch.randint(0, 1000, (300,)), cache, logits_for="none")
    for batch in args.batch:
        times = {name: [] for name in models}
        for _ in range(args.steps):
            for name, model in models.items():
                chosen = caches[name][:batch]
                steps = [Step.chain(torch.randint(0, 1000, (1,)), cache.length) for cache in chosen]
                start = time.perf_counter()
                model.forward_batch(steps, chosen)
                times[name].append(time.perf_counter() - start)
                for cache in chosen:
                    cache.rollback(1)
        print(json.dumps({"batch": batch, **{f"{name}_ms": round(statistics.median(t) * 1e3, 2)
                                             for name, t in times.items()}}), flush=True)


if __name__ == "__main__":
    main()
