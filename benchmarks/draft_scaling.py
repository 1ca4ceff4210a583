"""Does the draft need the target's RoPE scaling? Tier acceptances of `triforce` with the target under
`--rope-scaling`, the draft scaled alike (what LLM does) and then unscaled (its streaming cache never
shows it a position past sinks + window, so it runs within its native positions either way).

    python benchmarks/draft_scaling.py [--tokens 16000] [--rope-scaling yarn:4] [--text ../shared/data/austen-emma.txt]

SmolLM2 and its shipped draft, greedy, 128 new tokens; prints one JSON line per draft."""
from __future__ import annotations

import argparse
import json

from triforce.api import LLM
from triforce.sampling_params import SamplingParams
from triforce.models.loader import load_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=16000)
    p.add_argument("--rope-scaling", default="yarn:4")
    p.add_argument("--text", default="../shared/data/austen-emma.txt")
    args = p.parse_args()
    llm = LLM("smollm2", mode="triforce", rope_scaling=args.rope_scaling, prefix_cache_gb=0)
    ids = llm.tokenizer(open(args.text, encoding="utf-8").read()).input_ids[: args.tokens]
    params = SamplingParams(max_tokens=128, temperature=0, ignore_eos=True)
    for label in ("scaled", "unscaled"):
        if label == "unscaled":
            llm.draft = load_model(llm.draft_path, llm.dtype, llm.device)
        metrics = llm.generate([ids], params)[0].metrics
        print(json.dumps({"draft": label, "rope_scaling": args.rope_scaling, "prompt_tokens": len(ids),
                          "acceptance": {t.name: round(t.acceptance_rate, 3) for t in metrics.tiers}}), flush=True)


if __name__ == "__main__":
    main()
