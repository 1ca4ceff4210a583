"""Two drafts of one target, paired: whole requests through LLM.generate, each draft's turns alternating in
one process (this host's noise moves a run's speed by half; neighbouring turns see the same moment).

    python benchmarks/draft_pair.py [--drafts default self] [--modes draft triforce] [--batch 1 4 8]
        [--length 7936] [--temperature 0] [--max-new-tokens 128] [--turns 3] [--seed 0]
        [--settings draft_weights=int8 gamma1=6] [--rope-scaling yarn:4 --length 16000]

A draft is `default` (the target's default draft: SmolLM2's shipped one) or anything `--draft` takes
(`self`: the target's own weights over the draft tier's streaming cache); one draft twice compares
--settings with its defaults (the second named NAME+settings). B prompts are cut from the six
novels in ../shared/data (prompt i from novel i mod 6, its KV restored from a prefix store after a first,
unmeasured turn per LLM); each draft runs with the engine's default settings, the second with --settings
over them (engine settings as `LLM` takes them: numbers are read as numbers, true and false as booleans).
Prints a JSON line per (mode, batch): each draft's tokens/s per turn (generated tokens over the longest
decode), the median of each draft's turns, each draft's tier acceptance and, in mode auto, the modes its
plans ran and with which gammas (its last turn's), and the medians' ratio second / first.
At temperature 0 it also says whether every turn's tokens were equal.
"""
from __future__ import annotations

import argparse
import glob
import json
import statistics
from pathlib import Path

from triforce import LLM, SamplingParams

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drafts", nargs=2, default=["default", "self"])
    parser.add_argument("--modes", nargs="+", default=["draft", "triforce"])
    parser.add_argument("--batch", type=int, nargs="+", default=[8])
    parser.add_argument("--length", type=int, default=7936)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prefix-cache-gb", type=float, default=2.0)
    parser.add_argument("--rope-scaling", default=None, help="KIND:FACTOR, as --rope-scaling (for prompts past 8K)")
    parser.add_argument("--settings", nargs="*", default=[], help="KEY=VALUE engine settings of the second draft's")
    args = parser.parse_args()
    settings = dict(setting(item) for item in args.settings)
    labels = args.drafts if args.drafts[0] != args.drafts[1] else [args.drafts[0], args.drafts[1] + "+settings"]
    texts = sorted(glob.glob(str(ROOT.parent / "shared/data/austen-*.txt")))
    for mode in args.modes:
        llms = {label: LLM("smollm2", mode=mode, dtype="bfloat16", prefix_cache_gb=args.prefix_cache_gb,
                           rope_scaling=args.rope_scaling, draft=None if name == "default" else name,
                           **(settings if i else {}))
                for i, (label, name) in enumerate(zip(labels, args.drafts))}
        files = [next(iter(llms.values())).tokenizer(Path(t).read_text(encoding="utf-8"))["input_ids"] for t in texts]
        for batch in args.batch:
            prompts = [files[i % len(files)][(i // len(files)) * args.length:][:args.length] for i in range(batch)]
            params = SamplingParams(max_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                                    ignore_eos=True)
            rates = {name: [] for name in llms}
            outputs, tiers, plans, gammas = [], {}, {}, {}
            for name, llm in llms.items():  # a first turn each fills its prefix store, unmeasured
                llm.generate(prompts, params, use_tqdm=False)
            for turn in range(args.turns):
                for name, llm in (llms.items() if turn % 2 == 0 else reversed(llms.items())):
                    outs = llm.generate(prompts, params, use_tqdm=False)
                    decode = max(o.metrics.decode_s for o in outs)
                    rates[name].append(round(sum(len(o.token_ids) for o in outs) / decode, 2))
                    outputs.append([o.token_ids for o in outs])
                    tiers[name] = acceptance(outs)
                    decisions = [d for o in outs for d in o.metrics.auto or []]
                    plans[name] = sorted({d["mode"] for d in decisions})
                    gammas[name] = sorted({" ".join([d["mode"], *map(str, d["gammas"])]) for d in decisions})
            medians = {name: statistics.median(r) for name, r in rates.items()}
            first, second = labels
            row = {"mode": mode, "batch": batch, "length": args.length, "temperature": args.temperature,
                   "rope_scaling": args.rope_scaling,
                   "settings": settings, "proposer_weights": {name: llm.proposer_weights for name, llm in llms.items()},
                   "tokens_per_s": rates, "median": medians, "acceptance": tiers, "auto_modes": plans,
                   "auto_plans": gammas,
                   f"{second}_over_{first}": round(medians[second] / medians[first], 3)}
            if args.temperature == 0:
                row["outputs_equal"] = all(o == outputs[0] for o in outputs)
            print(json.dumps(row), flush=True)
        del llms


def setting(item: str) -> tuple[str, object]:
    name, _, value = item.partition("=")
    if value.lower() in ("true", "false"):
        return name, value.lower() == "true"
    for kind in (int, float):
        try:
            return name, kind(value)
        except ValueError:
            pass
    return name, value


def acceptance(outs) -> dict[str, float]:
    """Each tier's acceptance over the batch's requests: accepted / proposed of its checks."""
    proposed, accepted = {}, {}
    for out in outs:
        for tier in out.metrics.tiers:
            proposed[tier.name] = proposed.get(tier.name, 0) + tier.proposed
            accepted[tier.name] = accepted.get(tier.name, 0) + tier.accepted
    return {name: round(accepted[name] / max(1, proposed[name]), 3) for name in proposed}


if __name__ == "__main__":
    main()
