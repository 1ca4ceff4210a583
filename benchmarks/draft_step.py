"""What one step of the draft costs over its streaming cache: the fused layer loop (one C++ call for all
layers, kernels/decoder.py) against the model's layer-by-layer loop, taking turns, on the same cache state.

    python benchmarks/draft_step.py [--model smollm2] [--text ../shared/data/austen-emma.txt] [--steps 300]

Prints JSON: the median milliseconds of a one-token step (logits of the last row, as a proposal takes)
each way, and of a 7-token tree level. Needs a bfloat16 CPU with the kernels (AVX2 at least).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from triforce import LLM
from triforce.cache.streaming import StreamingKVCache
from triforce.step import Step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--text", default=str(Path(__file__).resolve().parents[2] / "shared/data/austen-emma.txt"))
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    llm = LLM(args.model, mode="draft", dtype="bfloat16")
    draft = llm.draft
    ids = llm.encode(Path(args.text).read_text(encoding="utf-8"))[:1024 + 2 * args.steps + 16]
    fused = draft.fused_layers
    cache = StreamingKVCache(draft.config, 16, 256, 64, draft.rope, draft.dtype, "cpu")
    for i in range(0, 1024, 256):
        draft(torch.tensor(ids[i:i + 256]), cache, logits_for="none")
    times = {"fused": [], "layers": [], "fused_tree7": [], "layers_tree7": []}
    parents = [-1, 0, 0, 1, 1, 2, 2]
    for i in range(args.steps):
        for way, loop in (("fused", fused), ("layers", None)):
            draft.fused_layers = loop
            token = torch.tensor([ids[1024 + i]])
            start = time.perf_counter()
            draft(token, cache, logits_for="last")
            times[way].append(time.perf_counter() - start)
            cache.rollback(1)
            if i % 10 == 0:  # a tree level, then dropped
                step = Step.tree(torch.tensor(ids[1024 + i:1024 + i + 7]), parents, cache.length)
                start = time.perf_counter()
                draft(step, cache)
                times[f"{way}_tree7"].append(time.perf_counter() - start)
                cache.rollback(7)
        draft.fused_layers = fused
        draft(torch.tensor([ids[1024 + i]]), cache, logits_for="none")  # the window moves on
    print(json.dumps({"model": args.model, "steps": args.steps,
                      **{f"{way}_ms": round(1e3 * statistics.median(t), 3) for way, t in times.items()}}))


if __name__ == "__main__":
    main()
