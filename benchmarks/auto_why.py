"""What mode auto decided and why, request by request: a model (SmolLM2 unless --model) on the first N
tokens of a text, one request per seed, in one process (each later request starts from what the earlier
ones saw: priors.py; and restores the prompt's KV from the first's, unless --prefix-cache-gb 0).

    python benchmarks/auto_why.py [--length 4096] [--seeds 0 1] [--temperature 0.6] [--decisions 3]
        [--text ../shared/data/austen-emma.txt] [--model qwen2.5-coder-1.5b] [--costs]
        [--rope-scaling yarn:4] [--stretches]

Run it with a fresh TRIFORCE_HOME to see a machine's first requests (symlink its `models` folder to skip
the download). Prints per request its decode tokens/s and its first decisions: mode, gammas, the
predicted tokens/s of each mode, the acceptance, the realized factors and where the prior came from.
With --stretches, also each stretch of a plan as it ends: the tokens/s it reached, and what the speed
model predicts at the acceptance the stretch's own checks saw and at the estimate the planner held."""
from __future__ import annotations

import argparse

import triforce.coordinator.planning as planning
from triforce import LLM, SamplingParams


def print_stretches() -> None:
    """Wraps AutoPlanner.observe_rate (called as each stretch ends) to print the stretch."""
    observe_rate = planning.AutoPlanner.observe_rate

    def observed(self, plan, tokens_per_s, tokens):
        if plan.mode not in self.times.scaled:  # a plan this planner did not score (a batch leader's)
            return observe_rate(self, plan, tokens_per_s, tokens)
        costs = self.times.per_sequence(plan.stack)
        at_own, at_held = (self.predicted(plan, costs, stretch) for stretch in (True, False))
        checks = ", ".join(f"{n} {a.mean:.2f} over {a.trials:.0f}" for n, a in self._stretch.items())
        print(f"    stretch {plan.mode} {list(plan.gammas)}: {tokens_per_s:.1f} tokens/s; the model "
              f"{at_own:.1f} at its checks' acceptance ({checks}), {at_held:.1f} at the estimate", flush=True)
        return observe_rate(self, plan, tokens_per_s, tokens)

    planning.AutoPlanner.observe_rate = observed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--decisions", type=int, default=3)
    p.add_argument("--text", default="../shared/data/austen-emma.txt")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--draft", default=None, help="default: the model's own default draft")
    p.add_argument("--prefix-cache-gb", type=float, default=2.0)
    p.add_argument("--costs", action="store_true", help="also print each decision's forward costs (ms)")
    p.add_argument("--rope-scaling", default=None, help="KIND:FACTOR, as `triforce generate` takes it")
    p.add_argument("--stretches", action="store_true", help="print each stretch of a plan as it ends")
    args = p.parse_args()
    if args.stretches:
        print_stretches()
    llm = LLM(args.model, draft=args.draft, mode="auto", prefix_cache_gb=args.prefix_cache_gb,
              rope_scaling=args.rope_scaling)
    ids = llm.tokenizer(open(args.text).read())["input_ids"][: args.length]
    print(f"{len(ids)} prompt tokens", flush=True)
    for seed in args.seeds:
        params = SamplingParams(max_tokens=args.max_new_tokens, temperature=args.temperature, seed=seed)
        metrics = llm.generate([ids], params)[0].metrics
        print(f"seed {seed}: {metrics.tokens_per_s:.1f} tokens/s; prefill {metrics.prefill_s:.0f} s"
              f" ({metrics.cached_prompt_tokens} prompt tokens restored); " +
              "; ".join(f"{t.drafter}->{t.name} {t.accepted}/{t.proposed} in {t.checks} checks" for t in metrics.tiers),
              flush=True)
        for d in (metrics.auto or [])[: args.decisions]:
            why = d.get("why", {})
            print(f"  at {d['at_token']}: {d['mode']} {d['gammas']}; predicted {why.get('predicted_tokens_per_s')};"
                  f" acceptance {why.get('acceptance')}; realized {why.get('realized')}; prior {why.get('prior')}")
            if args.costs:
                print(f"    cost scale {why.get('cost_scale')}; forward ms {why.get('forward_ms')}; "
                      f"overhead ms {why.get('overhead_ms')}")


if __name__ == "__main__":
    main()
