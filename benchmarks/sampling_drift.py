"""Does a mode sample the target's distribution over long runs of the real model? Two statistics whose
mean is 0 token by token when sampling is exact, whatever the text: d1 = log p(x) + H(p) and
d2 = [x is p's argmax] - max p, with p the target's distribution (at the run's temperature) after the
tokens before x, from one forward of the target over the prompt and the output.

    python benchmarks/sampling_drift.py --modes ar triforce --seeds 1,2,3 --length 7936 --new 256

The chi-square tests (tests/coordinator) check exactness on tiny models; this checks the real model, its
dtype and the prompt lookup over hundreds of tokens. Each token's term has mean 0 given the tokens before
it, so the mean over all tokens of all seeds is within a few standard errors of 0 for an exact mode (d2 is
bounded; d1 is heavy-tailed, its z less telling). Prints one JSON line per seed and mode, then per mode
the means, their standard errors and z."""
from __future__ import annotations

import json
import math

import torch

from triforce import LLM, SamplingParams
from triforce.cache.full import FullKVCache
from triforce.coordinator.tiers import Tier
from triforce.speculation.sampling import probabilities
from triforce.step import Step
from sampled_paths import path_parser, prompt_ids, seeds  # beside this script


def main() -> None:
    p = path_parser(__doc__.splitlines()[0], seeds="1,2,3")
    p.add_argument("--modes", nargs="+", default=["ar", "triforce"])
    args = p.parse_args()
    llms = {mode: LLM(model="smollm2", mode=mode, dtype="bfloat16") for mode in args.modes}
    first = next(iter(llms.values()))
    ids = prompt_ids(first.tokenizer, args)
    target = first.target
    scorer = Tier("target", target, FullKVCache(target.config, len(ids) + args.new + 1, target.dtype,
                                                target.device))
    scorer.prefill(ids[:-1])
    base = scorer.length
    sums = {mode: [0.0, 0.0, 0.0, 0.0, 0] for mode in llms}  # d1, d1^2, d2, d2^2, tokens
    for seed in seeds(args):
        for mode, llm in llms.items():
            params = SamplingParams(max_tokens=args.new, temperature=args.temperature, seed=seed, ignore_eos=True)
            tokens = llm.generate([ids], params)[0].token_ids
            scorer.truncate(base)
            rows = probabilities(scorer.forward(Step.chain([ids[-1]] + tokens[:-1], base)).float(), args.temperature)
            x = torch.tensor(tokens)
            chosen = rows[torch.arange(len(tokens)), x]
            d1 = torch.log(chosen) + -(rows * torch.log(rows.clamp_min(1e-30))).sum(1)
            top, argmax = rows.max(1)
            d2 = (argmax == x).float() - top
            s = sums[mode]
            for i, v in enumerate((d1.sum(), (d1 * d1).sum(), d2.sum(), (d2 * d2).sum())):
                s[i] += float(v)
            s[4] += len(tokens)
            print(json.dumps({"seed": seed, "mode": mode, "d1_mean": round(float(d1.mean()), 4),
                              "d2_mean": round(float(d2.mean()), 4), "tokens": len(tokens)}), flush=True)
    summary = {}
    for mode, (a, aa, b, bb, n) in sums.items():
        out = {}
        for name, total, squares in (("d1", a, aa), ("d2", b, bb)):
            mean = total / n
            se = math.sqrt(max(squares / n - mean * mean, 0.0) / n)
            out[name] = {"mean": round(mean, 4), "se": round(se, 4), "z": round(mean / se, 2) if se else None}
        summary[mode] = {**out, "tokens": n}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
