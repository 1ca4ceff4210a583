"""Mode auto's machinery with its plan forced: every request of a batch runs one mode at the configured
gammas for the whole request, and the leader prints each stretch's tokens/s against what the speed model
predicts at the acceptance that stretch's own checks saw, so the model's miss for each mode is seen apart
from the planner's choices. Runs take turns in one process (the prompts' KV restored from the first).

    python benchmarks/forced_plan.py draft:4:6 triforce:4:6 retrieval:4:6 triforce:1:3 [--batch 8]
        [--length 7936] [--temperature 0.6] [--max-new-tokens 128] [--texts ../shared/data/austen-*.txt]

Each run is MODE:GAMMA1:GAMMA2. Prints per stretch a line (its tokens and ratio) and per run a JSON line:
the aggregate tokens/s (generated tokens over the longest request's decode), each stretch's ratio (reached
over predicted, for the batch) and the modes that ran: a mode that is no candidate at this length (a
retrieval tier needs a context of twice its budget) does not. Plans from $TRIFORCE_HOME's cost table and
priors, as mode auto would (a calibration folder holding only the costs and proposer timings starts every
run from the generic priors)."""
from __future__ import annotations

import argparse
import glob
import json
import time

import triforce.coordinator.planning as planning
from triforce import LLM, SamplingParams
from triforce.coordinator.realized import RealizedSpeed


def force(mode_of_run: dict, stretches: list) -> None:
    """Makes `mode_of_run["mode"]` the planner's only choice at the configured gammas, with no `ar` probe, and
    records each stretch's ratio as the planner measures it (AutoPlanner.observe_rate, the leader's)."""
    realized, observe = planning.AutoPlanner._realized, RealizedSpeed.observe
    planning.AR_PROBE, planning.GAMMA_MARGIN = 0.0, float("inf")  # no probe; the configured gammas

    def scaled(self, mode):  # (scoring only: the stretches are measured against the model itself)
        return 1e6 if mode == mode_of_run["mode"] else realized(self, mode)

    def observed(self, mode, ratio, tokens):
        stretches.append({"tokens": tokens, "ratio": round(ratio, 3)})
        print(f"    stretch {mode}: {tokens} tokens at {ratio:.3f} of the model", flush=True)
        return observe(self, mode, ratio, tokens)

    planning.AutoPlanner._realized, RealizedSpeed.observe = scaled, observed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="MODE:GAMMA1:GAMMA2, e.g. triforce:4:6")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=7936)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--texts", nargs="+", default=sorted(glob.glob("../shared/data/austen-*.txt")))
    args = parser.parse_args()
    runs = [(mode, int(g1), int(g2)) for mode, g1, g2 in (run.split(":") for run in args.runs)]
    forced, stretches = {"mode": None}, []
    force(forced, stretches)
    llm, gammas = None, None
    for mode, g1, g2 in runs:
        if (g1, g2) != gammas:
            llm, gammas = None, (g1, g2)  # (the last one's memory first)
            llm = LLM("smollm2", mode="auto", prefix_cache_gb=4, gamma1=g1, gamma2=g2)
            prompts = [llm.tokenizer(open(args.texts[i % len(args.texts)]).read())["input_ids"][:args.length]
                       for i in range(args.batch)]
        forced["mode"], stretches[:] = mode, []
        print(f"{mode} [{g1}, {g2}]", flush=True)
        outs = llm.generate(prompts, SamplingParams(max_tokens=args.max_new_tokens, temperature=args.temperature,
                                                    seed=0, ignore_eos=True))
        decode = max(o.metrics.decode_s for o in outs)
        print(json.dumps({"mode": mode, "gammas": [g1, g2], "batch": args.batch, "tokens_per_s":
                          round(sum(len(o.token_ids) for o in outs) / decode, 2),
                          "plans": sorted({d["mode"] for d in outs[0].metrics.auto or []}),
                          "stretches": list(stretches), "at": time.strftime("%H:%M:%S")}), flush=True)


if __name__ == "__main__":
    main()
