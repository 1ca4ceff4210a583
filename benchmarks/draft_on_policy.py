"""How well a draft knows the target's own text against human text: top-1 agreement with the target and the
expected acceptance of one speculative-sampling draw at 0.6 (the sum of min(p, q)), teacher-forced, over
the human text before a prompt's end and over the target's continuation after it (greedy, and sampled at
each --temperatures).

    python benchmarks/draft_on_policy.py [--model smollm2] [--draft D] [--text ../shared/data/austen-emma.txt]
        [--prompts 12] [--prompt-tokens 768] [--new-tokens 256] [--temperatures 0 0.7]

Prompt i is --prompt-tokens of the text from token 20,000 + 9,000 i (*Emma* is held out of the shipped
draft's training); both models read the whole prompt and continuation (no streaming window, as the
draft's held-out evaluation reads: draft/evaluate.py), and each statistic runs over the prompt's last 256
positions (human) or the continuation's (the target's). A draft distilled on human prose and on the
target's answers to instructions (draft/sources.py) knows a text the target wrote itself only as well as
what it trained on resembles it: what training on the target's own continuations (on-policy data, as
DistillSpec does) could add shows here. Prints JSON."""
import argparse
import json

import torch

from triforce import LLM, SamplingParams
from triforce.cache.full import FullKVCache
from triforce.llm_models import DEFAULT_DRAFTS
from triforce.models.hub import resolve_model
from triforce.models.loader import load_model
from triforce.speculation.sampling import probabilities

HUMAN = 256  # the prompt's last positions scored as human text


def logits(model, row: list[int]) -> torch.Tensor:
    return model(torch.tensor(row), FullKVCache(model.config, len(row), model.dtype, "cpu"), logits_for="all").float()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--draft", default=None, help="default: the draft shipped for --model")
    p.add_argument("--text", default="../shared/data/austen-emma.txt")
    p.add_argument("--prompts", type=int, default=12)
    p.add_argument("--prompt-tokens", type=int, default=768)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    args = p.parse_args()
    llm = LLM(args.model, None, "ar")
    ids = llm.tokenizer(open(args.text).read())["input_ids"]
    prompts = [ids[20000 + i * 9000:20000 + i * 9000 + args.prompt_tokens] for i in range(args.prompts)]
    if len(prompts[-1]) < args.prompt_tokens:
        raise SystemExit(f"{args.text} is too short for {args.prompts} prompts of {args.prompt_tokens} tokens")
    target = load_model(resolve_model(args.model), "bfloat16", torch.device("cpu"))
    draft = load_model(resolve_model(args.draft or DEFAULT_DRAFTS[args.model]), "bfloat16", torch.device("cpu"))
    n, report = args.prompt_tokens, {}
    for temperature in args.temperatures:
        outs = llm.generate(prompts, [SamplingParams(max_tokens=args.new_tokens, temperature=temperature, seed=i,
                                                     ignore_eos=True) for i in range(len(prompts))], use_tqdm=False)
        sums = {"human": [0.0, 0.0, 0], "target": [0.0, 0.0, 0]}  # agreements, acceptance, positions
        for prompt, out in zip(prompts, outs):
            row = prompt + list(out.token_ids)
            pt, qd = logits(target, row), logits(draft, row)
            agree = (pt.argmax(-1) == qd.argmax(-1)).float()
            accept = torch.minimum(probabilities(pt, 0.6), probabilities(qd, 0.6)).sum(-1)
            for name, span in (("human", slice(n - HUMAN, n - 1)), ("target", slice(n, len(row) - 1))):
                sums[name][0] += agree[span].sum().item()
                sums[name][1] += accept[span].sum().item()
                sums[name][2] += agree[span].numel()
        report[f"continuation_t{temperature}"] = {
            name: {"top1_agreement": round(a / k, 3), "expected_acceptance_0.6": round(x / k, 3), "positions": k}
            for name, (a, x, k) in sums.items()}
    print(json.dumps({"model": args.model, "draft": args.draft or "shipped", **report}))


if __name__ == "__main__":
    main()
