"""Top-p on a model's real rows: the sort of the whole vocabulary (as `probabilities` did) against
`top_p_dropped` (speculation/sampling.py), one after the other in one process.

    python benchmarks/top_p_cost.py [--model smollm2] [--text ../shared/data/austen-emma.txt] [--tokens 512]
        [--top-p 0.8 0.9 0.95 0.99] [--temperatures 0.6 1.0] [--rows 1 7] [--reps 30]

The rows are the model's logits (bfloat16 weights) at the first --tokens positions of the text (without --text,
Pride and Prejudice's first sentence repeated), each call processing --rows of them. Prints a JSON line per (temperature, top_p,
rows): median milliseconds per row of each way, the rows whose top TOP_P_CANDIDATES did not reach top_p
(past the first 64, and past 4,096: ranked by a sort), and where the two parted: rows, tokens and
the largest probability of a token one kept and the other dropped (ties and roundings at the boundary)."""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from triforce.cache.full import FullKVCache
from triforce.models.hub import resolve_model
from triforce.models.loader import load_model
from triforce.speculation.sampling import TOP_P_CANDIDATES, top_p_dropped, top_p_dropped_by_sort
from triforce.step import Step

FALLBACK_TEXT = "It is a truth universally acknowledged, that a single man in possession of a good fortune, " \
                "must be in want of a wife. "


def median_ms_per_row(fn, blocks: list[torch.Tensor], reps: int) -> float:
    times = []
    for _ in range(reps):
        for block in blocks:
            start = time.perf_counter()
            fn(block)
            times.append((time.perf_counter() - start) / block.shape[0])
    return 1e3 * statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--text", default=None)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--top-p", type=float, nargs="+", default=[0.8, 0.9, 0.95, 0.99])
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.6, 1.0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 7])
    p.add_argument("--reps", type=int, default=30)
    args = p.parse_args()

    folder = resolve_model(args.model)
    from transformers import AutoTokenizer

    text = open(args.text, encoding="utf-8").read() if args.text else FALLBACK_TEXT * 200
    ids = torch.tensor(AutoTokenizer.from_pretrained(folder)(text).input_ids[: args.tokens])
    model = load_model(folder, "bfloat16")
    with torch.inference_mode():
        logits = model(Step.chain(ids, 0), FullKVCache(model.config, len(ids), model.dtype, "cpu"),
                       logits_for="all").float()  # [tokens, V]
    for temperature in args.temperatures:
        scaled = logits / temperature
        for top_p in args.top_p:
            parting = top_p_dropped(scaled, top_p) != top_p_dropped_by_sort(scaled, top_p)  # [tokens, V]
            parted = {"rows": f"{int(parting.any(-1).sum())}/{len(ids)}", "tokens": int(parting.sum()),
                      "largest_probability": float(scaled.softmax(-1)[parting].max()) if parting.any() else 0.0}
            short = [int((probs.sum(-1) < top_p).sum()) for probs in (
                (scaled.topk(k, dim=-1).values - scaled.logsumexp(-1, keepdim=True)).exp() for k in TOP_P_CANDIDATES)]
            for rows in args.rows:
                blocks = list(scaled[: (len(ids) // rows) * rows].split(rows))[:64]
                sort_ms, ranked_ms = (round(median_ms_per_row(lambda b: way(b, top_p), blocks, args.reps), 4)
                                      for way in (top_p_dropped_by_sort, top_p_dropped))
                out = {"temperature": temperature, "top_p": top_p, "rows": rows, "sorted_ms_per_row": sort_ms,
                       "top_p_dropped_ms_per_row": ranked_ms, "parted_from_the_sort": parted,
                       "rows_past_candidates": {k: f"{n}/{len(ids)}" for k, n in zip(TOP_P_CANDIDATES, short)}}
                print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
