"""How often tier 2 accepts the draft's first proposal of a round, by how the round started: after the
round before ended in a rejection, after it accepted every proposal, or after a target check. `triforce`
mode, SmolLM2 (bfloat16 by default), 7,936 tokens of Emma, 256 new tokens, one seed, for each gamma1 given.

    python benchmarks/round_starts.py [--temperature T] [--gamma1 2 4] [--dtype float32]
        [--prompt-tokens 7936] [--max-new-tokens 256] [--budget N] [--text FILE]

Prints JSON: per gamma1 and kind of start (and over all rounds), the first proposal's acceptance and the
rounds counted. Mode auto's geometric model takes that acceptance as one number (coordinator/planning.py);
if it depends on how the round started, the acceptance learned under one gamma1 does not carry to another.
Greedy in float32, every gamma1 decodes the same text, and a position's verdict can change only with the
tiers' state: then it also compares the verdicts at the positions where rounds of every gamma1 began
(equal verdicts with unequal rates: acceptance differs with gamma1 through which positions begin rounds).
"""
import argparse
import collections
import dataclasses
import json
from pathlib import Path

from triforce.api import LLM
from triforce.sampling_params import SamplingParams
from triforce.coordinator.engine import HierarchyEngine


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--gamma1", type=int, nargs="+", default=[2, 4])
    p.add_argument("--text", default="../shared/data/austen-emma.txt")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--prompt-tokens", type=int, default=7936)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--budget", type=int, default=None, help="the retrieval cache's (default: the engine's)")
    args = p.parse_args()
    checks: list[tuple[int, int, int, int]] = []  # (level, proposed, accepted, first position) of every chain check
    record = HierarchyEngine._record

    def recorded(self, level, proposed, accepted):
        checks.append((level, proposed, accepted, len(self.seq) - proposed))
        return record(self, level, proposed, accepted)

    HierarchyEngine._record = recorded
    settings = {} if args.budget is None else {"budget": args.budget}
    llm = LLM(mode="triforce", dtype=args.dtype, prefix_cache_gb=0, **settings)
    ids = llm.tokenizer(Path(args.text).read_text(encoding="utf-8")).input_ids[:args.prompt_tokens]
    out, texts, verdicts = {}, [], []
    for gamma1 in args.gamma1:
        llm.config = dataclasses.replace(llm.config, gamma1=gamma1)
        checks.clear()
        done = llm.generate([ids], SamplingParams(max_tokens=args.max_new_tokens, temperature=args.temperature,
                                                  seed=args.seed, ignore_eos=True))[0]
        counts = collections.defaultdict(lambda: [0, 0])
        for before, (level, _, accepted, _) in zip([None] + checks, checks):
            if level != 1 or before is None:
                continue
            kind = ("after a target check" if before[0] == 2 else
                    "after a full accept" if before[2] == before[1] else "after a rejection")
            for counted in (kind, "all rounds"):
                counts[counted][0] += accepted >= 1
                counts[counted][1] += 1
        out[gamma1] = {kind: {"first_accepted": round(a / n, 3), "rounds": n} for kind, (a, n) in counts.items()}
        texts.append(done.token_ids)
        verdicts.append({position: accepted >= 1 for level, _, accepted, position in checks if level == 1})
    report = {"temperature": args.temperature, "seed": args.seed, "dtype": args.dtype, "by_gamma1": out,
              "same_text": all(t == texts[0] for t in texts)}
    common = set.intersection(*(set(v) for v in verdicts))
    report["common_starts"] = len(common)
    report["common_verdicts_agree"] = sum(len({v[p] for v in verdicts}) == 1 for p in common)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
