"""A chain grown through the tree code against the chain itself, over sample paths: tokens accepted per
check at each tier. The tree code given a chain's shape (one node per level, gamma1 of them) proposes and
checks what the chain does (its forwards give the same logits), so over many paths the two should accept
alike; a gap that persists would point at a difference in how the two sample.

    python benchmarks/chain_through_trees.py --length 7936 --new 256 --temperature 0.6 --seeds 1,2,3,4

Prints one JSON line per seed and run, then the means per run."""
from __future__ import annotations

import json
import statistics

from triforce import LLM, SamplingParams
from triforce.coordinator import trees
from sampled_paths import path_parser, prompt_ids, seeds  # beside this script


def main() -> None:
    p = path_parser(__doc__.splitlines()[0], seeds="1,2,3,4")
    p.add_argument("--mode", default="triforce", choices=["triforce", "draft"])
    p.add_argument("--gamma1", type=int, default=4)
    args = p.parse_args()
    chain_shape = [-1] + list(range(args.gamma1 - 1))
    trees.TreeShaper.shape = lambda self: chain_shape  # the tree code, a chain's shape
    runs = {"chain": LLM(model="smollm2", mode=args.mode, dtype="bfloat16", gamma1=args.gamma1),
            "chain through trees": LLM(model="smollm2", mode=args.mode, dtype="bfloat16", gamma1=args.gamma1,
                                       tree1=args.gamma1)}
    ids = prompt_ids(runs["chain"].tokenizer, args)
    accepted: dict[str, list[list[float]]] = {name: [] for name in runs}
    for seed in seeds(args):
        for name, llm in runs.items():
            params = SamplingParams(max_tokens=args.new, temperature=args.temperature, seed=seed, ignore_eos=True)
            m = llm.generate([ids], params)[0].metrics
            per_check = [round(t.mean_accepted_length, 3) for t in m.tiers]
            accepted[name].append(per_check)
            print(json.dumps({"seed": seed, "run": name, "tokens_per_s": round(m.tokens_per_s, 2),
                              "accepted_per_check": dict(zip([t.name for t in m.tiers], per_check))}), flush=True)
    print(json.dumps({name: [round(statistics.mean(col), 3) for col in zip(*rows)] for name, rows in accepted.items()}))


if __name__ == "__main__":
    main()
