"""Whether a decode starts slower than it goes on: the time between the text pieces a request streams (one
per round: in `ar`, per token) right after a long prefill, two requests in one process (the second with
every allocation and kernel already warm).

    python benchmarks/decode_start.py [--mode ar] [--length 7936] [--max-new-tokens 96]
        [--temperature 0.6] [--text ../shared/data/austen-emma.txt]

Mode auto measures a mode over its first stretch (8 rounds; `ar`: 8 tokens) and scales that mode's
predictions by what it saw, so a slow start would count against whichever mode runs first. Prints one
JSON line per request: the first 16 gaps in ms, the mean over the first 8, over the next 8 and over the
rest, and the request's decode tokens/s; the first piece's latency (the first forward after the prefill)
is not among the gaps. Prefix reuse is off, so each request prefills."""
from __future__ import annotations

import argparse
import json
import statistics
import time

from triforce import LLM, SamplingParams


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", default="ar")
    p.add_argument("--length", type=int, default=7936)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--text", default="../shared/data/austen-emma.txt")
    args = p.parse_args()
    if args.max_new_tokens < 24:
        raise SystemExit("--max-new-tokens must be at least 24 (16 gaps to show and some after)")
    llm = LLM(model="smollm2", mode=args.mode, prefix_cache_gb=0)
    with open(args.text, encoding="utf-8") as f:
        ids = llm.encode(f.read())[: args.length]
    for request in range(2):
        stamps: list[float] = []
        params = SamplingParams(max_tokens=args.max_new_tokens, temperature=args.temperature, seed=request,
                                ignore_eos=True)
        out = llm.generate([ids], params, stream=lambda _: stamps.append(time.perf_counter()))[0]
        gaps = [1e3 * (b - a) for a, b in zip(stamps, stamps[1:])]
        if len(gaps) <= 16:
            raise SystemExit(f"only {len(gaps) + 1} pieces streamed (a speculative mode commits several tokens "
                             f"a round): raise --max-new-tokens")
        print(json.dumps({"request": request, "mode": args.mode, "first_16_ms": [round(g, 1) for g in gaps[:16]],
                          "mean_first_8_ms": round(statistics.mean(gaps[:8]), 2),
                          "mean_next_8_ms": round(statistics.mean(gaps[8:16]), 2),
                          "mean_rest_ms": round(statistics.mean(gaps[16:]), 2),
                          "tokens_per_s": round(out.metrics.tokens_per_s, 2)}))


if __name__ == "__main__":
    main()
