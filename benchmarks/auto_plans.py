"""Why `--mode auto` plans what it plans: one request, and each plan change with the planner's reasons.

    python benchmarks/auto_plans.py [--text F] [--context 7936] [--max-new-tokens 128] [--temperature 0]
                                    [--lookup N] [--every-plan] [--out FILE]

Generates after the first `--context` tokens of the text with the default model, draft and mode (auto),
and prints a JSON line per plan change: the token it came at, the mode and gammas, and the planner's
`why` (predicted tokens/s per mode, acceptance estimates, realized-speed factors, cost scales, where its
prior came from); then one line with the request's decode speed. `--every-plan` prints a line at every
re-plan instead, changed or not, with the acceptance estimates (mean, optimistic, trials of evidence), the
realized-speed factors and cost scales as they stood. Run with TRIFORCE_CPU_ISA to see a lower
kernel path's plans.
"""
from __future__ import annotations

import argparse
import json

from triforce.api import LLM
from triforce.sampling_params import SamplingParams
from triforce.coordinator import planning

WHY = ("predicted_tokens_per_s", "acceptance", "realized", "cost_scale", "prior")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--text", default="../shared/data/austen-emma.txt")
    p.add_argument("--context", type=int, default=7936)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--lookup", type=int, default=None, help="prompt lookup's N (default: the engine's)")
    p.add_argument("--every-plan", action="store_true", help="a line at every re-plan, changed or not")
    p.add_argument("--out", help="also append the lines to this file")
    args = p.parse_args()
    every: list[dict] = []
    if args.every_plan:
        plan = planning.AutoPlanner.plan

        def logged(self, context, generated, busy=False, measure=True):
            best = plan(self, context, generated, busy, measure)
            every.append({"at_token": generated, "mode": best.mode, "gammas": list(best.gammas),
                          "stop_below": best.stop_below,
                          "predicted_tokens_per_s": round(best.tokens_per_s, 2),
                          "acceptance": {n: [round(a.mean, 3), round(a.optimistic, 3), round(a.trials, 1)]
                                         for n, a in self.estimates().items()},
                          "realized": {m: round(x, 3) for m, x in self.realized.items()},
                          "cost_scale": {n: round(x, 3) for n, x in self.times.scale.items()}})
            return best
        planning.AutoPlanner.plan = logged
    llm = LLM(**({} if args.lookup is None else {"lookup": args.lookup}))
    with open(args.text) as f:
        ids = llm.tokenizer.encode(f.read())[:args.context]
    params = SamplingParams(max_tokens=args.max_new_tokens, temperature=args.temperature, ignore_eos=True)
    metrics = llm.generate([ids], params)[0].metrics
    lines = every or [{"at_token": d["at_token"], "mode": d["mode"], "gammas": d["gammas"],
                       **{k: d.get("why", {}).get(k) for k in WHY}} for d in metrics.auto or []]
    lines.append({"context": len(ids), "lookup": args.lookup, "tokens_per_s": metrics.to_dict()["tokens_per_s"]})
    for line in lines:
        print(json.dumps(line))
    if args.out:
        with open(args.out, "a") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)


if __name__ == "__main__":
    main()
