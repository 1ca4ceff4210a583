"""What log-probabilities cost: one request's decode speed and prefill time without them, with
`logprobs` K (each generated token's entry and top K) and with `prompt_logprobs` K as well (the prompt
scored as it is prefilled), on the default model, the settings taking turns.

    python benchmarks/logprobs_cost.py --text ../shared/data/austen-emma.txt [--length 2048]
        [--max-new-tokens 128] [--mode triforce] [--temperature 0] [--top 5] [--repeats 3]

Prints JSON: per setting, each turn's tokens/s and prefill seconds, and their medians."""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from triforce import LLM, SamplingParams
from triforce.kernels.cpu import cpu_isa, cpu_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--text", required=True)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--length", type=int, default=2048, help="prompt tokens, from the text's start")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--mode", default="triforce")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top", type=int, default=5, help="K: the most likely tokens listed beside each")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    llm = LLM(args.model, mode=args.mode, prefix_cache_gb=0)
    prompt = llm.encode(Path(args.text).read_text(encoding="utf-8"))[:args.length]
    base = dict(max_tokens=args.max_new_tokens, temperature=args.temperature, seed=0, ignore_eos=True)
    settings = {"none": SamplingParams(**base), "logprobs": SamplingParams(**base, logprobs=args.top),
                "logprobs+prompt": SamplingParams(**base, logprobs=args.top, prompt_logprobs=args.top)}
    llm.generate(prompt[:64], SamplingParams(max_tokens=8))  # kernels built, caches warm
    runs = {name: {"tokens_per_s": [], "prefill_s": []} for name in settings}
    for _ in range(args.repeats):
        for name, params in settings.items():
            m = llm.generate(prompt, params)[0].metrics
            runs[name]["tokens_per_s"].append(round(m.tokens_per_s, 2))
            runs[name]["prefill_s"].append(round(m.prefill_s, 2))
    out = {"model": args.model, "mode": args.mode, "prompt_tokens": len(prompt), "max_new_tokens": args.max_new_tokens,
           "temperature": args.temperature, "top": args.top, "threads": torch.get_num_threads(),
           "cpu": cpu_model(), "isa": cpu_isa(),
           "dtype": str(llm.target.dtype), "runs": runs,
           "median": {name: {k: statistics.median(v) for k, v in r.items()} for name, r in runs.items()}}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
