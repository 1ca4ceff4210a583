"""Where a batch's decode time goes, per mode: every batched forward (tier, how many sequences, tokens each,
seconds) and every batched chain verification, logged while LLM.generate runs the same prompts in each mode.
Prints a JSON line per mode: `decode_s` from the end of the target's prefill (so mode auto's first plan and
the draft's prefill count in it), `metrics_decode_s` the longest request's own decode time (what the bench
divides by), and the seconds in forwards per tier and number of sequences in the call, in verification, in
auto's plans (with any cost measurement they make), and outside all of them (sampling, bookkeeping).

    python benchmarks/batch_timeline.py --model qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b \
        --text ../shared/data/austen-emma.txt --length 7936 --batch 4 --temperature 0.6 --modes ar auto

The prompts are cut as the bench cuts them (prompt i from token i * length); the first mode prefills them,
the others reuse the prompts' target KV (prefix store), so a mode's decode is what differs.
"""
import argparse
import dataclasses
import json
import time
from collections import defaultdict

import triforce.coordinator.batch as batch_module
import triforce.coordinator.planning as planning
import triforce.coordinator.tiers as tiers_module
from triforce import LLM, SamplingParams

PREFILL_ROWS = 16  # a step of more tokens is a prompt chunk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--draft", default=None)
    parser.add_argument("--text", required=True)
    parser.add_argument("--length", type=int, default=7936)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modes", nargs="+", default=["ar", "auto"])
    args = parser.parse_args()

    log: list[tuple] = []
    forward_together, check_together = tiers_module.forward_together, batch_module.check_together

    def timed_forward(tiers, steps, logits_for):
        began = time.perf_counter()
        out = forward_together(tiers, steps, logits_for)
        log.append(("forward", tiers[0].name, len(tiers), max(s.n for s in steps), began, time.perf_counter()))
        return out

    def timed_check(checks):
        began = time.perf_counter()
        out = check_together(checks)
        log.append(("verify", "", len(checks), 0, began, time.perf_counter()))
        return out

    plan = planning.AutoPlanner.plan

    def timed_plan(self, *args, **kwargs):  # mode auto's plans (the first measures costs the table lacks)
        began = time.perf_counter()
        out = plan(self, *args, **kwargs)
        log.append(("plan", "", self.batchmates.size(self) if self.batchmates else 1, 0, began,
                    time.perf_counter()))
        return out

    tiers_module.forward_together, batch_module.check_together = timed_forward, timed_check
    planning.AutoPlanner.plan = timed_plan
    llm = LLM(args.model, args.draft, "auto", prefix_cache_gb=4)
    base = llm.config
    ids = llm.tokenizer(open(args.text).read())["input_ids"]
    prompts = [ids[i * args.length:(i + 1) * args.length] for i in range(args.batch)]
    for mode in args.modes:
        llm.config = dataclasses.replace(base, mode=mode)
        log.clear()
        outs = llm.generate(prompts, SamplingParams(max_tokens=args.max_new_tokens, temperature=args.temperature,
                                                    seed=args.seed, ignore_eos=True))
        print(json.dumps({mode: summary(log, outs)}), flush=True)


def summary(log: list[tuple], outs) -> dict:
    """Decode: from the end of the target's last prompt chunk to the end of the last forward or check."""
    prefill_end = max((end for kind, name, _, n, _, end in log if name == "target" and n > PREFILL_ROWS),
                      default=min(entry[4] for entry in log))  # prompts all reused: no chunk ran
    decode = [entry for entry in log if entry[4] >= prefill_end]
    wall = max(entry[5] for entry in decode) - prefill_end
    seconds, calls = defaultdict(float), defaultdict(int)
    for kind, name, together, n, began, end in decode:
        key = f"{kind} {name} x{together} n{n}" if kind == "forward" else f"{kind} x{together}"
        seconds[key] += end - began
        calls[key] += 1
    inside = sum(seconds.values())
    generated = sum(len(o.token_ids) for o in outs)
    return {"generated": generated, "decode_s": round(wall, 3), "tokens_per_s": round(generated / wall, 2),
            "metrics_decode_s": round(max(o.metrics.decode_s for o in outs), 3),
            "outside_calls_s": round(wall - inside, 3),
            "calls": {k: {"n": calls[k], "s": round(seconds[k], 3), "ms_each": round(1e3 * seconds[k] / calls[k], 1)}
                      for k in sorted(seconds, key=seconds.get, reverse=True)}}


if __name__ == "__main__":
    main()
