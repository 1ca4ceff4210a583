"""Whether a round's first proposal fares by its position or by the gamma that put a round there.

    python benchmarks/round_positions.py [--gammas 2 4] [--prompt-tokens 3000] [--max-new-tokens 200]
        [--budget 1024] [--text ../shared/data/austen-emma.txt]

SmolLM2 with the shipped draft in mode `triforce`, float32 and greedy (so every gamma decodes the same
text and a position's verdict can only change with the state of the tiers): records where each check of
the draft by the retrieval tier began and whether its first proposal was accepted. Prints JSON: per gamma,
the rounds and their first-proposal rate, by how the round began (after a correction, after a round whose
proposals were all accepted, after a target check); and over the positions where rounds of every gamma
began, how many verdicts agree. Equal verdicts with unequal rates mean acceptance differs with gamma
through which positions begin rounds (mode auto then needs each gamma's own checks: acceptance.py)."""
from __future__ import annotations

import argparse
import json

from triforce import LLM, SamplingParams
from triforce.coordinator.engine import HierarchyEngine


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gammas", type=int, nargs="+", default=[2, 4])
    p.add_argument("--prompt-tokens", type=int, default=3000)
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--budget", type=int, default=1024)
    p.add_argument("--text", default="../shared/data/austen-emma.txt")
    args = p.parse_args()
    checks: list[tuple[int, int, int]] = []  # (position of the first proposal, proposed, accepted)
    record = HierarchyEngine._record

    def recording(self, level, proposed, accepted):
        if level == 1 and len(self.tiers) == 3:  # the retrieval tier checks the draft
            checks.append((len(self.seq) - proposed, proposed, accepted))
        return record(self, level, proposed, accepted)

    HierarchyEngine._record = recording
    text = open(args.text).read()
    runs = {}
    for gamma in args.gammas:
        llm = LLM("smollm2", mode="triforce", dtype="float32", gamma1=gamma, budget=args.budget)
        ids = llm.tokenizer(text)["input_ids"][: args.prompt_tokens]
        checks.clear()
        out = llm.generate([ids], SamplingParams(max_tokens=args.max_new_tokens, temperature=0))[0]
        runs[gamma] = (out.token_ids, list(checks))
    report = {"same_text": len({tuple(tokens) for tokens, _ in runs.values()}) == 1, "gammas": {}}
    for gamma, (_, log) in runs.items():
        kinds: dict[str, list[bool]] = {}
        for i, (position, proposed, accepted) in enumerate(log[1:], 1):
            before, n, a = log[i - 1]
            kind = ("after_all_accepted" if a == n else "after_correction") if position == before + a + 1 \
                else "after_target_check"
            kinds.setdefault(kind, []).append(accepted > 0)
        firsts = [a > 0 for _, _, a in log]
        report["gammas"][gamma] = {"rounds": len(log), "first_accepted": round(sum(firsts) / len(firsts), 3),
                                   **{k: {"rounds": len(v), "first_accepted": round(sum(v) / len(v), 3)}
                                      for k, v in sorted(kinds.items())}}
    verdicts = [{p: a > 0 for p, _, a in log} for _, log in runs.values()]
    common = set.intersection(*(set(v) for v in verdicts))
    report["common_starts"] = len(common)
    report["common_verdicts_agree"] = sum(len({v[p] for v in verdicts}) == 1 for p in common)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
