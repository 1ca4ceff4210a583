"""Would a draft that stops proposing when unsure pay? A replay against the measured cost curve.

    python benchmarks/confidence_stop.py [--text F] [--context 7600] [--tokens 512] [--costs-ms 1:11.9,...]

Generates `--tokens` greedy tokens with the target (plain decoding) after `--context` tokens of the text,
then runs the shipped draft over the same text: at each position, its top probability and whether its
greedy token is the target's. A chain of up to G proposals that stops after a proposal whose top
probability is below a threshold (the draft's own state only, so exactness holds) is replayed from those:
accepted = the leading run of matches. With a target check of n tokens costing `--costs-ms` (interpolated;
default: the cost table's avx2 entries for SmolLM2 at 8K on the Zen 4 of docs/avx2.md), a draft step
`--draft-ms` and `--round-ms` of bookkeeping per round, it prints JSON: the speedup over plain decoding for
each G and threshold (0 = a fixed chain of G).
"""
from __future__ import annotations

import argparse
import json

from triforce.api import LLM
from triforce.cache.streaming import StreamingKVCache
from triforce.sampling_params import SamplingParams
from triforce.step import Step


def replay(rows, gamma, threshold, cost, draft_ms, round_ms):
    t = seconds = tokens = 0
    while t < len(rows):
        k = 0
        while k < gamma and t + k < len(rows):
            k += 1
            if rows[t + k - 1][0] < threshold:
                break
        accepted = 0
        while accepted < k and rows[t + accepted][1]:
            accepted += 1
        seconds += k * draft_ms + cost(k + 1) + round_ms
        tokens += accepted + 1
        t += accepted + 1
    return tokens / seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--text", default="../shared/data/austen-emma.txt")
    p.add_argument("--context", type=int, default=7600)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--costs-ms", default="1:11.9,2:16.0,3:20.4,4:23.8,6:36.3,9:55.9")
    p.add_argument("--draft-ms", type=float, default=1.36)
    p.add_argument("--round-ms", type=float, default=1.4)
    args = p.parse_args()
    costs = {int(k): float(v) for k, v in (pair.split(":") for pair in args.costs_ms.split(","))}

    def cost(n):
        sizes = sorted(costs)
        lo = max([s for s in sizes if s <= n], default=sizes[0])
        hi = min([s for s in sizes if s >= n], default=sizes[-1])
        if lo == hi:
            return costs[lo] + (n - lo) * (costs[sizes[-1]] - costs[sizes[-2]]) / (sizes[-1] - sizes[-2])
        return costs[lo] + (costs[hi] - costs[lo]) * (n - lo) / (hi - lo)

    llm = LLM(mode="draft", prefix_cache_gb=0)
    ids = llm.tokenizer(open(args.text, encoding="utf-8").read()[:400_000]).input_ids[:args.context]
    out = llm.generate([ids], SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True))[0]
    text = ids + out.token_ids
    draft, cfg = llm.draft, llm.config
    cache = StreamingKVCache(draft.config, cfg.sinks, cfg.window, 64, draft.rope, draft.dtype, draft.device)
    for i in range(0, len(ids) - 1, 128):
        draft.forward(Step.chain(text[i:min(i + 128, len(ids) - 1)], cache.length), cache, "none")
    rows = []
    for i in range(len(ids) - 1, len(text) - 1, 64):
        chunk = text[i:min(i + 64, len(text) - 1)]
        conf, arg = draft.forward(Step.chain(chunk, cache.length), cache, "all").float().softmax(-1).max(-1)
        rows += [(float(conf[j]), int(arg[j]) == text[i + j + 1]) for j in range(len(chunk))]
    plain = 1 / cost(1)
    table = {f"gamma{g}": {f"{th:g}": round(replay(rows, g, th, cost, args.draft_ms, args.round_ms) / plain, 3)
                           for th in (0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)} for g in (2, 3, 4, 6, 8)}
    print(json.dumps({"top1_agreement": round(sum(r[1] for r in rows) / len(rows), 3), "positions": len(rows),
                      "speedup_over_plain": table}, indent=1))


if __name__ == "__main__":
    main()
