"""How the tokens of chains that `stop_below` ends early fare at the check, by whether the proposer was sure
of them (its top probability at least stop_below, or the prompt lookup's copy: the chain went on past
them) or not (the chain ended there), and how often a chain went on past a token (`goes_on`): fixed
`draft` mode (or `retrieval`, whose retrieval tier proposes with --gamma2) on the first N tokens of a
text, one request per seed, in one process. Each token the check reached is a trial (the first rejection
ends the walk), as mode auto's planner counts them (speed_model.STOP_RATES). Prints JSON.

    python benchmarks/stop_split.py [--mode draft] [--length 4096] [--seeds 0 1 2 3] [--temperature 0.6]
        [--gamma 4] [--stop-below 0.3] [--text ../shared/data/austen-emma.txt] [--model smollm2]
"""
from __future__ import annotations

import argparse
import json

import triforce.coordinator.engine as engine_module
from triforce import LLM, SamplingParams
from triforce.coordinator.speed_model import stop_trials


def count_trials(trials: list[tuple[bool, bool]], went_on: list[bool]) -> None:
    """Wraps HierarchyEngine._record to add (sure, accepted) per token each chain check reached, and
    whether the chain went on past each of its tokens."""
    record = engine_module.HierarchyEngine._record

    def recorded(self, level, proposed, accepted):
        record(self, level, proposed, accepted)
        if level == 1:
            trials.extend(stop_trials(self.went_on, accepted))
            went_on.extend(self.went_on)

    engine_module.HierarchyEngine._record = recorded


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--mode", choices=("draft", "retrieval"), default="draft")
    p.add_argument("--gamma", type=int, default=4, help="the proposer's chain: gamma1 (draft), gamma2 (retrieval)")
    p.add_argument("--stop-below", type=float, default=0.3)
    p.add_argument("--text", default="../shared/data/austen-emma.txt")
    p.add_argument("--model", default="smollm2")
    args = p.parse_args()
    trials: list[tuple[bool, bool]] = []
    went_on: list[bool] = []
    count_trials(trials, went_on)
    llm = LLM(args.model, mode=args.mode, stop_below=args.stop_below,
              **{"gamma1" if args.mode == "draft" else "gamma2": args.gamma})
    ids = llm.tokenizer(open(args.text).read())["input_ids"][: args.length]
    for seed in args.seeds:
        llm.generate([ids], SamplingParams(max_tokens=args.max_new_tokens, temperature=args.temperature, seed=seed))
    out = {"model": args.model, "prompt_tokens": len(ids), "temperature": args.temperature, "seeds": args.seeds,
           "mode": args.mode, "gamma": args.gamma, "stop_below": args.stop_below, "trials": len(trials),
           "goes_on": round(sum(went_on) / max(1, len(went_on)), 3)}
    for name, sure in (("sure", True), ("unsure", False)):
        kind = [ok for was_sure, ok in trials if was_sure == sure]
        out[name] = {"trials": len(kind), "accepted": round(sum(kind) / max(1, len(kind)), 3)}
    out["pooled"] = round(sum(ok for _, ok in trials) / max(1, len(trials)), 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
