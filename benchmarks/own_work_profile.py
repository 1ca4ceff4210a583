"""Where a request's own work between forwards goes (what mode auto's overhead per tier and role holds):
one request, or a batch of them, with the coordinator's steps timed directly, as JSON.

    python benchmarks/own_work_profile.py [--mode retrieval] [--length 7936] [--batch 1]
        [--max-new-tokens 96] [--text ../shared/data/austen-emma.txt ...] [--model smollm2]
        [--temperature 0] [--seed 0] [--set tree1=6 --set tree_shape=confidence ...]

Each function of WATCHED is wrapped in a timer (perf_counter around the call; inclusive: a function's
seconds hold those of the watched functions it calls), so the figures are wall time as the run spends it,
without a profiler's cost per call (cProfile, used before, adds it to every small torch call). Of the
batch's steps whose model calls carried no prompt chunk (decoding), `between_forwards_s` is what they
spent outside model calls: the runs' own work (sampling, verification, syncs, bookkeeping), also per
target check of a sequence. "prefill" and "mixed" (some sequences prefilling, others decoding) and their
"... forwards" are the other steps' seconds (the retrieval cache's first build falls in prefill).
"forward TIER xB n=N": decoding model calls of a tier for B sequences, the first of them with N tokens.
In mode auto the cost table's measurements (costs.py, not wrapped) count as own work.
"""
import argparse
import functools
import inspect
import json
import time
from collections import defaultdict

from triforce.api import LLM
from triforce.cache import retrieval
from triforce.sampling_params import SamplingParams
from triforce.coordinator import batch, engine, request_rows, tiers

# (owner, attribute): what to time. `tiers.forward_together` is every model call of a batch step.
WATCHED = [(tiers, "forward_together"), (batch, "check_together"), (batch.SequenceBatch, "step"),
           (batch.SequenceBatch, "_advance"), (tiers.RetrievalTier, "sync"), (tiers.Tier, "keep_path"),
           (retrieval.RetrievalKVCache, "rebuild"), (retrieval.RetrievalKVCache, "sync"),
           (engine.HierarchyEngine, "_commit"), (request_rows.RequestRows, "probs")]


def watch(clock: dict) -> None:
    """Wraps each WATCHED function so that `clock[name]` = [calls, seconds]; and splits the batch's steps
    into "prefill" (every model call carried prompt chunks only), "decode" (none did) and "mixed", each
    with its seconds inside model calls ("... forwards")."""
    for owner, attr in WATCHED:
        real = getattr(owner, attr)
        name = f"{getattr(owner, '__name__', owner)}.{attr}".replace("triforce.coordinator.", "")
        is_static = isinstance(inspect.getattr_static(owner, attr), staticmethod)

        def timed(*args, _real=real, _name=name, **kwargs):
            start = time.perf_counter()
            try:
                return _real(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                entry = clock[_name]
                entry[0] += 1
                entry[1] += elapsed
                if _name == "tiers.forward_together":
                    clock["_step"]["forwards"] += elapsed
                    clock["_step"]["prefill"] |= "none" in args[2]
                    clock["_step"]["decode"] |= any(want != "none" for want in args[2])
                    if "none" not in args[2]:  # a decoding forward: by tier and tokens per sequence
                        by_tier = clock[f"forward {args[0][0].name} x{len(args[0])} n={args[1][0].n}"]
                        by_tier[0] += 1
                        by_tier[1] += elapsed
                elif _name == "SequenceBatch.step":
                    step = clock["_step"]
                    phase = "mixed" if step["prefill"] and step["decode"] else "prefill" if step["prefill"] else "decode"
                    for key, seconds in ((phase, elapsed), (f"{phase} forwards", clock["_step"]["forwards"])):
                        clock[key][0] += 1
                        clock[key][1] += seconds
                    clock["_step"] = {"forwards": 0.0, "prefill": False, "decode": False}

        functools.update_wrapper(timed, real)
        setattr(owner, attr, staticmethod(timed) if is_static else timed)


def number(value: str):
    """A --set value as the int or float it spells, else the string (tree1=auto)."""
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", default="retrieval")
    p.add_argument("--length", type=int, default=7936)
    p.add_argument("--batch", type=int, default=1, help="prompts run together, one per text (cycled)")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--text", nargs="+", default=["../shared/data/austen-emma.txt"])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0, help="the request's seed (sampled runs)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="an EngineConfig field (tree1=6, tree_shape=confidence, gamma1=4, ...)")
    args = p.parse_args()
    settings = {name: number(value) for name, value in (pair.split("=", 1) for pair in args.set)}
    llm = LLM(args.model, mode=args.mode, prefix_cache_gb=0, **settings)
    prompts = []
    for i in range(args.batch):
        with open(args.text[i % len(args.text)]) as f:
            prompts.append(llm.tokenizer(f.read())["input_ids"][:args.length])
    clock: dict = defaultdict(lambda: [0, 0.0])
    clock["_step"] = {"forwards": 0.0, "prefill": False, "decode": False}
    watch(clock)
    start = time.perf_counter()
    outputs = llm.generate(prompts, SamplingParams(max_tokens=args.max_new_tokens, temperature=args.temperature,
                                                    seed=args.seed, ignore_eos=True))
    wall = time.perf_counter() - start
    prefill = max(o.metrics.prefill_s for o in outputs)
    checks = sum(o.metrics.tiers[-1].checks for o in outputs if o.metrics.tiers)
    decode = max(o.metrics.decode_s for o in outputs)
    clock.pop("_step")
    steps, forwards = clock.pop("decode", [0, 0.0])[1], clock.pop("decode forwards", [0, 0.0])[1]
    print(json.dumps({
        "mode": args.mode, "settings": settings, "temperature": args.temperature, "seed": args.seed,
        "length": args.length, "batch": args.batch, "max_new_tokens": args.max_new_tokens,
        "wall_s": round(wall, 2), "prefill_s": round(prefill, 2), "decode_s": round(decode, 3),
        "target_checks": checks, "decode_steps_s": round(steps, 3), "decode_forwards_s": round(forwards, 3),
        "between_forwards_s": round(steps - forwards, 3),
        "between_forwards_ms_per_target_check": round(1e3 * (steps - forwards) / max(checks, 1), 2),
        "functions": {name: {"calls": calls, "seconds": round(seconds, 4),
                             "ms_per_call": round(1e3 * seconds / max(calls, 1), 3)}
                      for name, (calls, seconds) in sorted(clock.items(), key=lambda kv: -kv[1][1])}},
        indent=1))


if __name__ == "__main__":
    main()
