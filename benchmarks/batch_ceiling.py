"""What acceptance a batch needs for a speedup: `triforce` and `draft` mode in a batch of B, simulated from
one run's measured forward costs, against `ar`.

    python benchmarks/batch_timeline.py --text ../shared/data/austen-emma.txt --length 7936 --batch 8 \
        --temperature 0 --modes ar draft triforce > timeline.jsonl
    python benchmarks/batch_ceiling.py --timeline timeline.jsonl [--bench bench.json] [--target 2.3]

The costs come from the timeline's calls (ms per call by tier and by how many sequences it held): a draft
or retrieval call of k sequences costs fixed + k x each (a least-squares line over k), a target call of all
B sequences what the timeline's calls of that many tokens cost (keyed by the most a sequence held; `ar`'s
step at 1 token, between sizes a straight line). The acceptances are per token
(the chance the checker takes a proposal given it took the ones before), fitted from a bench file's
`accepted_per_depth` (`triforce bench ... --modes ar draft triforce --out bench.json`, the same batch and
temperature), or given. The simulation runs the batch as `SequenceBatch` does: each sequence proposes
gamma1 draft tokens and tier 2 checks them until its rounds hold gamma2 tokens (a sequence whose rounds
made few runs more, in calls of fewer sequences, while the others wait at the target: `stragglers`), then
one target call checks every sequence's tokens; `draft` mode checks gamma tokens per sequence each round.
The work between forwards (sampling, verification, bookkeeping) is left out, so these are ceilings for the
measured forwards: `measured` gives what the timeline's run reached. `needed` is the tier-1 acceptance at
which each mode would reach --target x `ar` (tier 2's as measured), by bisection. Prints JSON.
"""
from __future__ import annotations

import argparse
import json
import random
import re


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through points (x, y); a flat line through one x."""
    xs, ys = [x for x, _ in points], [y for _, y in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in points) / var if var else 0.0
    return my - slope * mx, slope


def costs(timeline: dict, batch: int) -> dict:
    """The draft's and the retrieval tier's (fixed, per sequence) ms of a call, a line over the sequences the
    calls held; the target's ms of a call of the whole batch, by the most tokens a sequence held in it."""
    calls = {}
    for mode in ("ar", "draft", "triforce"):
        for key, call in timeline.get(mode, {}).get("calls", {}).items():
            m = re.fullmatch(r"forward (\w+) x(\d+) n(\d+)", key)
            if m:
                calls.setdefault((m[1], int(m[2]), int(m[3])), []).append((call["n"], call["ms_each"]))
    mean = {k: sum(n * ms for n, ms in v) / sum(n for n, _ in v) for k, v in calls.items()}
    return {"draft": fit_line([(k, ms) for (tier, k, n), ms in mean.items() if tier == "draft" and n == 1]),
            "retrieval": fit_line([(k, ms) for (tier, k, n), ms in mean.items() if tier == "retrieval" and n > 1]),
            "target": {n: ms for (tier, k, n), ms in sorted(mean.items()) if tier == "target" and k == batch
                       and n <= 16}}


def target_ms(c: dict, n: float) -> float:
    """A target call of the whole batch whose sequences hold at most n tokens: between the measured sizes."""
    sizes = sorted(c["target"])
    lo = max([s for s in sizes if s <= n], default=sizes[0])
    hi = min([s for s in sizes if s >= n], default=sizes[-1])
    if hi == lo:
        return c["target"][lo] * (n / lo if n > hi else 1.0)
    return c["target"][lo] + (c["target"][hi] - c["target"][lo]) * (n - lo) / (hi - lo)


def per_token(checks: int, depths: list[int], held: int) -> float:
    """The per-token acceptance behind `checks` checks of at least `held` tokens each, depths[d] of which
    accepted a (d + 1)-th token: over the first `held` positions, acceptances over the checks that reached
    each (a check of more tokens reaches positions past `held` that the others lack)."""
    reached = [checks] + depths[:held - 1]
    return sum(depths[:held]) / max(1, sum(reached))


def bench_acceptance(path: str, batch: int, temperature: float) -> dict:
    """Per-token acceptances of a bench file's runs at this batch and temperature, by "mode:proposer->checker"
    (its chains of the bench's gamma1 tokens; tier 2's rounds held its gamma2 at least)."""
    bench = json.load(open(path))
    gamma1, gamma2, out = bench["engine"]["gamma1"], bench["engine"]["gamma2"], {}
    for run in bench["results"]:
        if run.get("batch", 1) != batch or abs(run["temperature"] - temperature) > 1e-9:
            continue
        for tier in run.get("tiers", []):
            held = gamma2 if tier["drafter"] == "retrieval" else gamma1
            out[f"{run['run']}:{tier['drafter']}->{tier['name']}"] = per_token(tier["checks"],
                                                                              tier["accepted_per_depth"], held)
    return out


def chain_yield(alpha: float, gamma: int, rng: random.Random) -> int:
    """Tokens one check of gamma proposals yields (accepted + the next token)."""
    k = 0
    while k < gamma and rng.random() < alpha:
        k += 1
    return k + 1


def triforce_rate(c: dict, batch: int, a1: float, a2: float, gamma1: int, gamma2: int, cycles: int, seed: int) -> float:
    rng, ms, tokens = random.Random(seed), 0.0, 0
    for _ in range(cycles):
        held = []
        for _ in range(batch):
            total = rounds = 0
            while total < gamma2:
                total, rounds = total + chain_yield(a1, gamma1, rng), rounds + 1
            held.append((total, rounds))
        for r in range(1, max(rounds for _, rounds in held) + 1):  # round r: the sequences still short
            k = sum(1 for _, rounds in held if rounds >= r)
            ms += gamma1 * (c["draft"][0] + c["draft"][1] * k) + c["retrieval"][0] + c["retrieval"][1] * k
        ms += target_ms(c, max(t for t, _ in held) + 1)  # (the timeline keys a call by its most tokens)
        tokens += sum(chain_yield(a2, t, rng) for t, _ in held)
    return 1e3 * tokens / ms


def draft_rate(c: dict, batch: int, a: float, gamma: int, cycles: int, seed: int) -> float:
    rng = random.Random(seed)
    ms = cycles * (gamma * (c["draft"][0] + c["draft"][1] * batch) + target_ms(c, gamma + 1))
    return 1e3 * sum(chain_yield(a, gamma, rng) for _ in range(cycles * batch)) / ms


def needed(rate, ar: float, target: float) -> float | None:
    """The least acceptance in [0, 0.995] at which rate(alpha) reaches target x ar (None: not there)."""
    lo, hi = 0.0, 0.995
    if rate(hi) < target * ar:
        return None
    for _ in range(14):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if rate(mid) < target * ar else (lo, mid)
    return round(hi, 3)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--timeline", required=True, help="benchmarks/batch_timeline.py's output (ar, draft, triforce)")
    p.add_argument("--bench", help="a triforce bench --out file of the same batch and temperature: acceptances")
    p.add_argument("--temperature", type=float, default=0.0, help="which of the bench's runs to read")
    p.add_argument("--alpha1", type=float, help="tier 1 per-token acceptance by tier 2 (else from --bench)")
    p.add_argument("--alpha2", type=float, help="tier 2 per-token acceptance by the target (else from --bench)")
    p.add_argument("--alpha-draft", type=float, help="the draft's by the target in draft mode (else --bench)")
    p.add_argument("--gamma1", type=int, default=4)
    p.add_argument("--gamma2", type=int, default=6)
    p.add_argument("--target", type=float, default=2.3, help="the speedup over ar to find the acceptance for")
    p.add_argument("--cycles", type=int, default=3000)
    args = p.parse_args()
    timeline = {}
    for line in open(args.timeline):
        timeline.update(json.loads(line))
    missing = [mode for mode in ("ar", "draft", "triforce") if mode not in timeline]
    if missing:
        raise SystemExit(f"{args.timeline} lacks mode {', '.join(missing)}: run batch_timeline.py with "
                         "--modes ar draft triforce")
    batch = int(re.search(r"x(\d+) n1", next(iter(timeline["ar"]["calls"])))[1])
    c = costs(timeline, batch)
    found = bench_acceptance(args.bench, batch, args.temperature) if args.bench else {}
    a1 = args.alpha1 if args.alpha1 is not None else found["triforce:draft->retrieval"]
    a2 = args.alpha2 if args.alpha2 is not None else found["triforce:retrieval->target"]
    ad = args.alpha_draft if args.alpha_draft is not None else found["draft:draft->target"]
    ar = 1e3 * batch / c["target"][1]

    def tri(a):
        return triforce_rate(c, batch, a, a2, args.gamma1, args.gamma2, args.cycles, 0)

    def dra(a):
        return draft_rate(c, batch, a, args.gamma1, args.cycles, 0)

    print(json.dumps({
        "batch": batch, "costs_ms": {"draft_fixed_and_per_sequence": [round(x, 2) for x in c["draft"]],
                                     "retrieval_fixed_and_per_sequence": [round(x, 2) for x in c["retrieval"]],
                                     "target_by_tokens": {n: round(ms, 1) for n, ms in c["target"].items()}},
        "acceptance": {"alpha1": round(a1, 3), "alpha2": round(a2, 3), "alpha_draft": round(ad, 3)},
        "ar_tokens_per_s": round(ar, 1),
        "simulated_over_ar": {"triforce": round(tri(a1) / ar, 2), "draft": round(dra(ad) / ar, 2)},
        "measured_over_ar": {m: round(timeline[m]["tokens_per_s"] / timeline["ar"]["tokens_per_s"], 2)
                             for m in ("draft", "triforce") if m in timeline},
        f"needed_for_{args.target}x": {"triforce_alpha1": needed(tri, ar, args.target),
                                       "draft_alpha": needed(dra, ar, args.target)},
    }, indent=1))


if __name__ == "__main__":
    main()
