"""Mode auto in a batch: every decision of the batch's first request (its leader, whose plans the others take),
with what it planned from: each mode's predicted and expected tokens/s, the acceptance estimates, the speed
factors, the cost scales and the forward costs per sequence; then each request's decode time.

    python benchmarks/batch_decisions.py [--batch 4] [--temperature 0.6] [--length 7936] [--seed 0]
        [--max-new-tokens 128] [--model smollm2] [--texts ../shared/data/austen-*.txt]

Prompt i is the first LENGTH tokens of text i (texts sorted by name, as the shell expands the bench's
--text ../shared/data/austen-*.txt; the bench's prompts of a batch of up to six), every request sampled
with SEED, as the bench does. Plans from $TRIFORCE_HOME's costs and priors (a home holding only the costs
plans as a first request would)."""
import argparse
import glob
import json

from triforce import LLM, SamplingParams

SHOWN = ("predicted_tokens_per_s", "expected_tokens_per_s", "acceptance", "realized", "cost_scale",
         "mode_cost_scale", "forward_ms", "batch")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--length", type=int, default=7936)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--texts", nargs="+", default=sorted(glob.glob("../shared/data/austen-*.txt")))
    args = p.parse_args()
    llm = LLM(args.model, mode="auto", prefix_cache_gb=0)
    prompts = []
    for i in range(args.batch):
        with open(args.texts[i % len(args.texts)]) as f:
            prompts.append(llm.tokenizer(f.read())["input_ids"][:args.length])
    params = SamplingParams(max_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                            ignore_eos=True)
    outputs = llm.generate(prompts, params)
    for decision in outputs[0].metrics.auto or []:
        why = decision.get("why", {})
        print(json.dumps({k: decision.get(k) for k in ("at_token", "mode", "gammas", "stop_below")}))
        for key in SHOWN:
            print(f"    {key} {json.dumps(why.get(key))}")
    print("decode_s", [round(o.metrics.decode_s, 2) for o in outputs])


if __name__ == "__main__":
    main()
