"""Auto's first request on a machine against the next: two greedy requests of 128 tokens over the same
7,936 tokens of a text, in one process, after a warm-up as `triforce bench` does.

    TRIFORCE_CALIBRATION=EMPTY_FOLDER python benchmarks/first_request.py --text ../shared/data/austen-emma.txt

With an empty calibration folder the first request measures its forward costs (in its prefill) and starts
from generic priors; the second has both. Prints one JSON line per request: decode seconds, tokens/s,
prefill seconds, auto's plans, and the seconds of each tier's forwards by kind (logits for all rows:
decode and cost measurements; none: prefill), so time spent outside the forwards shows."""
from __future__ import annotations

import argparse
import collections
import json
import time
from pathlib import Path

import triforce.coordinator.tiers as tiers
from triforce import LLM, SamplingParams


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--text", required=True)
    p.add_argument("--length", type=int, default=7936)
    p.add_argument("--requests", type=int, default=2)
    args = p.parse_args()
    spent: collections.Counter = collections.Counter()
    forward_many = tiers.Tier.forward_many

    def timed(tier_list, steps, logits_for):
        start = time.perf_counter()
        out = forward_many(tier_list, steps, logits_for)
        spent[f"{tier_list[0].name}:{logits_for[0]}"] += time.perf_counter() - start
        return out

    tiers.Tier.forward_many = staticmethod(timed)
    llm = LLM(mode="auto", prefix_cache_gb=0)
    ids = llm.tokenizer(Path(args.text).read_text(encoding="utf-8")).input_ids[: args.length]
    llm.generate([ids[:64]], SamplingParams(max_tokens=8))  # warm up kernels and allocator
    params = SamplingParams(max_tokens=128, temperature=0.0, ignore_eos=True)
    for request in range(args.requests):
        spent.clear()
        metrics = llm.generate([ids], params)[0].metrics
        print(json.dumps({"request": request, "decode_s": round(metrics.decode_s, 3),
                          "tokens_per_s": round(metrics.generated_tokens / metrics.decode_s, 2),
                          "prefill_s": round(metrics.prefill_s, 2),
                          "plans": [(d["at_token"], d["mode"], d["gammas"]) for d in metrics.auto],
                          "forward_s": {k: round(v, 3) for k, v in sorted(spent.items())}}))


if __name__ == "__main__":
    main()
