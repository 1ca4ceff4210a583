"""A retrieval tier whose budget covers the whole prompt computes what the target computes, so the target
should accept nearly every one of its tokens, and `triforce` should give `draft` mode's greedy tokens.

    python benchmarks/whole_budget_check.py [--text ../shared/data/austen-emma.txt] [--tokens 7936]

SmolLM2 in bfloat16, greedy, 96 new tokens. Prints JSON per mode: proposed/accepted per tier and the
first tokens. Rounding the logits to bfloat16 broke this (83 of 99 accepted, and a different first token
from a tie); the float32 logits of kernels/linear.py `logits_linear` fixed it."""
from __future__ import annotations

import argparse
import json

from triforce import LLM
from triforce.sampling_params import SamplingParams


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--text", default="../shared/data/austen-emma.txt")
    p.add_argument("--tokens", type=int, default=7936)
    args = p.parse_args()
    text = open(args.text, encoding="utf-8").read()
    report, outputs = {}, {}
    for mode in ("draft", "triforce"):
        llm = LLM("smollm2", mode=mode, dtype="bfloat16", prefix_cache_gb=0,
                  **({"budget": 8192} if mode == "triforce" else {}))  # (mode draft runs no retrieval tier)
        ids = llm.tokenizer(text).input_ids[: args.tokens]
        out = llm.generate([ids], SamplingParams(max_tokens=96, temperature=0, ignore_eos=True))[0]
        outputs[mode] = out.token_ids
        report[mode] = {"tiers": [{"tier": t.name, "drafter": t.drafter, "proposed": t.proposed,
                                   "accepted": t.accepted} for t in out.metrics.tiers],
                        "first_tokens": out.token_ids[:8]}
    report["same_tokens"] = outputs["draft"] == outputs["triforce"]
    print(json.dumps(report))


if __name__ == "__main__":
    main()
