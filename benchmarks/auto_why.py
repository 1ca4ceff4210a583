"""What mode auto decided and why, request by request: SmolLM2 on the first N tokens of a text, one
request per seed, in one process (each later request starts from what the earlier ones saw: priors.py).

    python benchmarks/auto_why.py [--length 4096] [--seeds 0 1] [--temperature 0.6] [--decisions 3]
        [--text ../shared/data/austen-emma.txt]

Run it with a fresh TRIFORCE_HOME to see a machine's first requests (symlink its `models` folder to skip
the download). Prints per request its decode tokens/s and its first decisions: mode, gammas, the
predicted tokens/s of each mode, the acceptance, the realized factors and where the prior came from."""
from __future__ import annotations

import argparse

from triforce import LLM, SamplingParams


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--decisions", type=int, default=3)
    p.add_argument("--text", default="../shared/data/austen-emma.txt")
    args = p.parse_args()
    llm = LLM("smollm2", mode="auto")
    ids = llm.tokenizer(open(args.text).read())["input_ids"][: args.length]
    for seed in args.seeds:
        params = SamplingParams(max_tokens=args.max_new_tokens, temperature=args.temperature, seed=seed)
        metrics = llm.generate([ids], params)[0].metrics
        print(f"seed {seed}: {metrics.tokens_per_s:.1f} tokens/s")
        for d in (metrics.auto or [])[: args.decisions]:
            why = d.get("why", {})
            print(f"  at {d['at_token']}: {d['mode']} {d['gammas']}; predicted {why.get('predicted_tokens_per_s')};"
                  f" acceptance {why.get('acceptance')}; realized {why.get('realized')}; prior {why.get('prior')}")


if __name__ == "__main__":
    main()
