"""How a proposer's acceptance moves along a request: a fixed mode's chain checks over the bench's batch prompts,
the share of proposed tokens accepted in each stretch of 16 generated tokens (all requests pooled), and
per request over the second half.

    python benchmarks/acceptance_by_position.py [--mode draft] [--length 7936] [--batch 8] [--temperature 0]
        [--max-new-tokens 128] [--texts ../shared/data/austen-*.txt]

Prompt i is cut as `triforce bench` cuts a batch's (bench_plan.batch_prompt: the texts sorted by name). Every
chain check of the bottom tier's proposals (its checker the tier above: the target in `draft` and `retrieval`
mode, the retrieval tier in `triforce`) counts at the position its request had reached (in `triforce` the
tokens tier 2 took, before the target's checks). Mode auto scores its plans from
the acceptance its checks show (speed_model.py), so a proposer accepted less at the start of a request than
later leads it away early. Prints JSON."""
import argparse
import dataclasses
import glob
import json
from collections import defaultdict

import triforce.coordinator.batch as batch_module
from triforce import LLM, SamplingParams
from triforce.launch.bench_plan import batch_prompt

STRETCH = 16


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", default="draft", choices=("draft", "retrieval", "triforce"))
    p.add_argument("--length", type=int, default=7936)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--texts", nargs="+", default=sorted(glob.glob("../shared/data/austen-*.txt")))
    args = p.parse_args()
    reached, checks = defaultdict(int), []  # per request (its generator): tokens so far; (request, at, g, accepted)
    check_together = batch_module.check_together

    def logged(waiting):
        out = check_together(waiting)
        for check, (verdict, _) in zip(waiting, out):
            if args.mode == "triforce" and not check.proposal:  # the target's checks of tier 2's tokens
                continue
            key = id(check.generator)
            checks.append((key, reached[key], len(check.draft_tokens), verdict.accepted))
            reached[key] += verdict.accepted + 1
        return out

    batch_module.check_together = logged
    llm = LLM("smollm2", None, "auto")
    files = [llm.tokenizer(open(f).read())["input_ids"] for f in sorted(args.texts)]
    llm.config = dataclasses.replace(llm.config, mode=args.mode)
    llm.generate([batch_prompt(files, i, args.length) for i in range(args.batch)],
                 SamplingParams(max_tokens=args.max_new_tokens, temperature=args.temperature, seed=0, ignore_eos=True),
                 use_tqdm=False)
    by_stretch, late = defaultdict(lambda: [0, 0]), defaultdict(lambda: [0, 0])
    for key, at, proposed, accepted in checks:
        by_stretch[at // STRETCH * STRETCH][0] += proposed
        by_stretch[at // STRETCH * STRETCH][1] += accepted
        if at >= args.max_new_tokens // 2:
            late[key][0] += proposed
            late[key][1] += accepted
    print(json.dumps({"mode": args.mode, "temperature": args.temperature, "length": args.length, "batch": args.batch,
                      "accepted_share_by_position": {at: round(a / g, 3) for at, (g, a) in sorted(by_stretch.items())},
                      "proposed_by_position": {at: g for at, (g, _) in sorted(by_stretch.items())},
                      "second_half_by_request": [round(a / g, 3) for g, a in late.values() if g]}))


if __name__ == "__main__":
    main()
