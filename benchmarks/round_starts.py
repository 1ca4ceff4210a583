"""How often tier 2 accepts the draft's first proposal of a round, by how the round started: after the
round before ended in a rejection, after it accepted every proposal, or after a target check. `triforce`
mode, SmolLM2 bfloat16, 7,936 tokens of Emma, 256 new tokens, one seed, for each gamma1 given.

    python benchmarks/round_starts.py [--temperature T] [--gamma1 2 4] [--text FILE]

Prints JSON: per gamma1 and kind of start, the first proposal's acceptance and the rounds counted. Mode
auto's geometric model takes that acceptance as one number (coordinator/planning.py); if it depends on how
the round started, the acceptance learned under one gamma1 does not carry to another.
"""
import argparse
import collections
import dataclasses
import json
from pathlib import Path

from triforce.api import LLM
from triforce.config import SamplingParams
from triforce.coordinator.engine import HierarchyEngine


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--gamma1", type=int, nargs="+", default=[2, 4])
    p.add_argument("--text", default="../shared/data/austen-emma.txt")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    checks: list[tuple[int, int, int]] = []  # (level, proposed, accepted) of every chain check, in order
    record = HierarchyEngine._record

    def recorded(self, level, proposed, accepted):
        checks.append((level, proposed, accepted))
        return record(self, level, proposed, accepted)

    HierarchyEngine._record = recorded
    llm = LLM(mode="triforce", dtype="bfloat16", prefix_cache_gb=0)
    ids = llm.tokenizer(Path(args.text).read_text(encoding="utf-8")).input_ids[:7936]
    out = {}
    for gamma1 in args.gamma1:
        llm.config = dataclasses.replace(llm.config, gamma1=gamma1)
        checks.clear()
        llm.generate([ids], SamplingParams(max_tokens=256, temperature=args.temperature, seed=args.seed,
                                           ignore_eos=True))
        counts = collections.defaultdict(lambda: [0, 0])
        for before, (level, _, accepted) in zip([None] + checks, checks):
            if level != 1 or before is None:
                continue
            kind = ("after a target check" if before[0] == 2 else
                    "after a full accept" if before[2] == before[1] else "after a rejection")
            counts[kind][0] += accepted >= 1
            counts[kind][1] += 1
        out[gamma1] = {kind: {"first_accepted": round(a / n, 3), "rounds": n} for kind, (a, n) in counts.items()}
    print(json.dumps({"temperature": args.temperature, "seed": args.seed, "by_gamma1": out}, indent=1))


if __name__ == "__main__":
    main()
