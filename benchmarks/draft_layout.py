"""How much a draft loses to the context its StreamingLLM cache gives it in the engine: top-1 agreement with the
target and the expected acceptance of one speculative-sampling draw at 0.6 (the sum of min(p, q)), teacher-
forced over the last --positions tokens of each prompt, with the target reading the whole prompt and the
draft reading it three ways:

- `whole`: the whole prompt, as train-draft's held-out evaluation reads (draft/evaluate.py);
- `sinks_window`: the prompt's first --sinks tokens, then the --window tokens before each stretch of 32 scored
  positions and the stretch itself, numbered from 0 without the gap between them: what the engine's
  streaming cache holds (its sinks turned to sit just before its window);
- `window`: the same without the sinks.

    python benchmarks/draft_layout.py [--model smollm2] [--draft D] [--text ../shared/data/austen-emma.txt]
        [--prompts 8] [--prompt-tokens 1024] [--positions 256] [--sinks 16] [--window 256]

Prompt i is --prompt-tokens of the text from token 20,000 + 9,000 i (*Emma* is held out of the shipped
draft's training). The draft is trained on whole sequences of 1,024 tokens (draft/data.py), so a gap
between `whole` and `sinks_window` is what training on the engine's layout could win back (past 1,024
tokens `whole` reads positions the draft never trained on). Prints JSON."""
import argparse
import json

import torch

from triforce.llm_models import DEFAULT_DRAFTS
from triforce.models.hub import resolve_model
from triforce.models.loader import load_model
from triforce.models.tokenizer import load_tokenizer
from triforce.speculation.sampling import probabilities

from draft_on_policy import logits  # the whole row's logits, in float32

STRETCH = 32  # scored positions per draft forward in the windowed layouts


def windowed(model, row: list[int], first: int, sinks: int, window: int) -> torch.Tensor:
    """The draft's logits for row[first:] in stretches, each read after the sinks and the window before it."""
    out = []
    for start in range(first, len(row), STRETCH):
        context = row[:sinks] + row[max(sinks, start - window):start + STRETCH]
        out.append(logits(model, context)[-len(row[start:start + STRETCH]):])
    return torch.cat(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--draft", default=None, help="default: the draft shipped for --model")
    p.add_argument("--text", default="../shared/data/austen-emma.txt")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=1024)
    p.add_argument("--positions", type=int, default=256)
    p.add_argument("--sinks", type=int, default=16)
    p.add_argument("--window", type=int, default=256)
    args = p.parse_args()
    target_path = resolve_model(args.model)
    target = load_model(target_path, "bfloat16", torch.device("cpu"))
    ids = load_tokenizer(target_path, target.config.vocab_size)(open(args.text).read())["input_ids"]
    prompts = [ids[20000 + i * 9000:20000 + i * 9000 + args.prompt_tokens] for i in range(args.prompts)]
    if len(prompts[-1]) < args.prompt_tokens:
        raise SystemExit(f"{args.text} is too short for {args.prompts} prompts of {args.prompt_tokens} tokens")
    draft = load_model(resolve_model(args.draft or DEFAULT_DRAFTS[args.model]), "bfloat16", torch.device("cpu"))
    first = args.prompt_tokens - args.positions
    sums: dict[str, list[float]] = {}
    for row in prompts:
        # a position's logits predict the next token: score positions first-1 .. end-2 against the target's
        pt = logits(target, row)[first - 1:-1]
        layouts = {"whole": logits(draft, row)[first - 1:-1],
                   "sinks_window": windowed(draft, row[:-1], first - 1, args.sinks, args.window),
                   "window": windowed(draft, row[:-1], first - 1, 0, args.window)}
        for name, qd in layouts.items():
            agree = (pt.argmax(-1) == qd.argmax(-1)).float().sum().item()
            accept = torch.minimum(probabilities(pt, 0.6), probabilities(qd, 0.6)).sum().item()
            s = sums.setdefault(name, [0.0, 0.0, 0])
            s[0], s[1], s[2] = s[0] + agree, s[1] + accept, s[2] + pt.shape[0]
    print(json.dumps({"model": args.model, "draft": args.draft or "shipped", "prompts": args.prompts,
                      "prompt_tokens": args.prompt_tokens, "sinks": args.sinks, "window_tokens": args.window,
                      **{name: {"top1_agreement": round(a / k, 4), "expected_acceptance_0.6": round(x / k, 4),
                                "positions": k} for name, (a, x, k) in sums.items()}}))


if __name__ == "__main__":
    main()
