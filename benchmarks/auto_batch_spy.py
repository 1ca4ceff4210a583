"""Every plan and every measured stretch of mode auto in a batch (a plan is recorded in the metrics only when
it changes): the Qwen2.5-Coder pair, four 8K prompts of Emma, 128 new tokens each, temperature 0.6, seed 0.
Prints the batch's aggregate decode tokens/s, then per plan (planner, token, busy, mode, gammas, predicted
tokens/s, acceptance, batch size) and per stretch (its rate times the batch size, the realized factors).

    python benchmarks/auto_batch_spy.py   (from the repository root; TRIFORCE_HOME as for the bench)
"""
import time
import triforce.coordinator.planning as planning
from triforce import LLM, SamplingParams
log = []
orig_rate, orig_plan = planning.AutoPlanner.observe_rate, planning.AutoPlanner.plan
def rate(self, plan, tps):
    log.append(("rate", id(self) % 1000, plan.mode, plan.gammas, round(tps * self._batch, 2)))
    r = orig_rate(self, plan, tps)
    log.append(("  realized", {k: round(v, 2) for k, v in self.realized.items()}))
    return r
def plan(self, context, generated, busy=False):
    p = orig_plan(self, context, generated, busy)
    log.append(("plan", id(self) % 1000, generated, busy, p.mode, p.gammas, round(p.tokens_per_s, 2),
                {n: round(a.mean, 2) for n, a in self.estimates().items()}, self._batch))
    return p
planning.AutoPlanner.observe_rate, planning.AutoPlanner.plan = rate, plan
llm = LLM("qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b", mode="auto")
ids = llm.tokenizer(open("../shared/data/austen-emma.txt").read())["input_ids"]
prompts = [ids[i * 7936:(i + 1) * 7936] for i in range(4)]
outs = llm.generate(prompts, SamplingParams(max_tokens=128, temperature=0.6, seed=0))
print("auto aggregate", round(sum(len(o.token_ids) for o in outs) / max(o.metrics.decode_s for o in outs), 2))
for row in log: print(row)
