"""What a stack of tiers decodes per second (`--mode auto`, planning.py), and the acceptance estimates it
takes.

The model (TriForce sec. 4.3 and Leviathan et al.'s expected walltime, one level at a time): a proposer
whose tokens the checker accepts independently with probability alpha gives, per check of gamma tokens,
E(alpha, gamma) = (1 - alpha^(gamma+1)) / (1 - alpha) tokens (the recovered or bonus token included). With
c_t(n) the measured seconds of a forward of n tokens at tier t (costs.py), the seconds per token of a
stack of tiers, cheapest first, are

    s_0 = c_0(1) + r                                                         (the bottom samples one by one)
    s_i = (gamma_i s_{i-1} + c_i(gamma_i + 1) + (gamma_i + 1) r) / E(alpha_i, gamma_i)  (one check of gamma_i)

where r is what turning one row of logits into the request's distribution costs (at temperature > 0 with
top-p, a sort of the vocabulary; timed once per request). That is a check of the bottom tier's chain of
gamma_i tokens. A check above a tier that itself checks (the target above the retrieval tier) takes every
token of that tier's rounds once they reach gamma_i (engine.py), so it holds n >= gamma_i tokens, n
distributed as where the rounds' summed yields first pass gamma_i (`check_sizes`), and gamma_i,
c_i(gamma_i + 1) and E are averaged over n. With `stop_below` (engine.py) the bottom tier's chains end
after a token its model was unsure of, so they hold gamma or fewer: the chain goes on past a token with
probability q, so it holds k < gamma tokens with probability q^(k-1) (1 - q) and gamma with q^(gamma-1)
(`chain_sizes`); its tokens but the last are ones the proposer was sure of, accepted with probability
alpha_sure, and the last is one it was unsure of (accepted with alpha_unsure) unless the chain reached
gamma; the check's cost and yield are averaged over those sizes (`stopped_chain_yields`). q, alpha_sure and
alpha_unsure are learned per proposer as acceptance is (`stop_names`). Priced as full chains at one
alpha, as it was until 2026-12-04, `draft` mode's stretches ran 1.10x their prediction on average (0.87-1.67x)
at 4K of Emma and 0.6 on the Zen 4: there SmolLM2's draft had 0.76 of the tokens it was sure of accepted and
0.38 of the others (`benchmarks/stop_split.py`). A plan is scored by 1 / s_top.

Acceptance is learned from the request's own checks: per proposer (the draft, whoever checks it, since the
retrieval tier stands in for the target; and each retrieval tier, one per budget in mode auto), successes /
trials of a geometric model (a chain check that accepted a of gamma is a successes and one failure if
a < gamma), starting from PRIOR worth PRIOR_TRIALS trials (a retrieval tier's lower where its budget is far
below the context: `prior`), or, where earlier requests of the same kind (machine, models, sampling
settings) ran, from the acceptance they saw, worth LEARNED_TRIALS (priors.py; their realized factors too:
planning.py); at each plan older evidence counts planner_evidence.EVIDENCE_KEPT as much for each
planner_evidence.EVIDENCE_TOKENS tokens committed since, so the estimate follows the text, and a proposer dropped
after a bad start drifts back to its prior and is tried again. An idle draft keeps adding evidence: at each
plan, what it would have proposed for the tokens committed meanwhile (auto.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .costs import interpolate
from .priors import MIN_TRIALS

PRIOR = {"draft": 0.6, "retrieval": 0.85}  # per-token acceptance before any check, by kind of tier...
PRIOR_TRIALS = 4.0  # ...worth this many trials
STOP_RATES = ("goes on", "sure", "unsure")  # with `stop_below`, per bottom proposer: how often its chain goes
# on past a token, and how often its tokens are accepted where it was sure of them (the chain went on past
# them) or not (`stop_names`)
PRIOR_GOES_ON = 0.6  # the first, before any chain; the other two start from the proposer's PRIOR
PRIOR_STEP = 0.07  # a retrieval tier's prior is this much lower for each halving of its budget below a
# quarter of the context (`prior`)
STACK_MODES = {("target",): "ar", ("draft", "target"): "draft", ("retrieval", "target"): "retrieval",
               ("draft", "retrieval", "target"): "triforce"}


SELF_DRAFT_TIER = "draft@self"  # mode auto's second draft tier: the target's own weights over a streaming cache


def retrieval_name(budget: int, configured: int) -> str:
    """The name of the retrieval tier of `budget` in mode auto, which holds one per candidate budget
    (hierarchy.py): "retrieval" for the configured budget, as in the fixed modes; "retrieval@B" for others."""
    return "retrieval" if budget == configured else f"retrieval@{budget}"


def tier_kind(name: str) -> str:
    """"draft", "retrieval" or "target": what a tier named `name` is, whatever its budget or model
    ("retrieval@8192", "draft@self": SELF_DRAFT_TIER)."""
    return name.partition("@")[0]


def is_draft(name: str) -> bool:
    """Whether tier `name` is a draft tier (either of mode auto's: the draft model's or SELF_DRAFT_TIER)."""
    return tier_kind(name) == "draft"


def has_draft(stack: tuple[str, ...]) -> bool:
    """Whether `stack` runs a draft tier (at its bottom, where a draft always runs)."""
    return is_draft(stack[0])


def prior(name: str, budget: int | None = None, context: int | None = None) -> float:
    """The acceptance a tier named `name` starts from where no earlier request of its kind ran: PRIOR of
    its kind; a retrieval tier's PRIOR_STEP lower per halving of its `budget` below a quarter of the
    `context`. The target accepted SmolLM2's (yarn:4, Emma, greedy, AMX Xeon) 0.79 / 0.82 / 0.91 of the
    time at budgets of a sixteenth / an eighth / a quarter of 32K, 0.62-0.65 at an eighth of 16K and
    0.94 at a quarter (docs/cli.md: Longer contexts); with one prior for all, mode auto tried the cheapest,
    poorest budget first."""
    if tier_kind(name) != "retrieval" or not budget or not context:
        return PRIOR[tier_kind(name)]
    return PRIOR["retrieval"] - PRIOR_STEP * max(0.0, math.log2(context / (4 * budget)))


def stop_names(proposer: str) -> tuple[str, str, str]:
    """The names under which the planner keeps `proposer`'s STOP_RATES beside the acceptance estimates:
    "goes on:draft", "sure:draft", "unsure:draft"."""
    return tuple(f"{rate}:{proposer}" for rate in STOP_RATES)


def stop_trials(went_on: list[bool], accepted: int) -> list[tuple[bool, bool]]:
    """(sure, accepted) for each token of a stopped chain that its check reached (up to the first rejection),
    `went_on` saying of each of its tokens whether the chain went on past it: the trials of the STOP_RATES'
    acceptance, sure or not."""
    return [(sure, i < accepted) for i, sure in enumerate(went_on[:accepted + 1])]


def stack_mode(stack: tuple[str, ...]) -> str:
    """The mode that runs `stack` (STACK_MODES), with what tells its tiers from others of their kind, cheapest
    first: ("draft", "retrieval@8192", "target") runs "triforce@8192", ("draft@self", "target") "draft@self",
    ("draft@self", "retrieval@8192", "target") "triforce@self@8192"."""
    marks = "".join(f"@{name.partition('@')[2]}" for name in stack if "@" in name)
    return STACK_MODES[tuple(tier_kind(name) for name in stack)] + marks


def mode_stack(mode: str) -> tuple[str, ...]:
    """The stack that `mode` (stack_mode's name) runs: a budget's mark names the retrieval tier, another
    mark the draft."""
    base, *marks = mode.split("@")
    stack = next(stack for stack, name in STACK_MODES.items() if name == base)
    budget = next((m for m in marks if m.isdecimal()), "")
    draft = next((m for m in marks if not m.isdecimal()), "")
    marked = {"retrieval": budget, "draft": draft}
    return tuple(f"{name}@{marked[name]}" if marked.get(name) else name for name in stack)


def expected_tokens(alpha: float, gamma: int) -> float:
    """Tokens gained per check of gamma proposals each accepted with probability alpha (bonus included)."""
    return gamma + 1.0 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def chain_sizes(gamma: int, goes_on: float) -> dict[int, float]:
    """How many tokens the bottom tier's chain of at most gamma holds, by probability, when it goes on past
    each token with probability `goes_on` (`stop_below`)."""
    sizes = {k: goes_on ** (k - 1) * (1 - goes_on) for k in range(1, gamma)}
    sizes[gamma] = goes_on ** (gamma - 1)
    return {k: p for k, p in sizes.items() if p > 0}


def check_yields(alpha: float, sizes: dict[int, float]) -> dict[int, float]:
    """How many tokens a check yields (its accepted proposals and the next token), by probability, when it
    holds n proposals with probability sizes[n], each accepted with probability alpha until the first not."""
    return _yields({n: (p, [alpha] * n) for n, p in sizes.items()})


def stopped_chain_yields(gamma: int, goes_on: float, sure: float, unsure: float) -> tuple[dict, dict]:
    """(sizes, yields) by probability of a check of the bottom tier's chain of at most gamma that
    `stop_below` ends after a token it was unsure of (the module docstring): a chain of k < gamma holds k - 1
    tokens accepted with probability `sure` and one with `unsure`; a chain of gamma, gamma - 1 and one sure
    with probability `goes_on`."""
    sizes = chain_sizes(gamma, goes_on)
    last = {n: unsure if n < gamma else goes_on * sure + (1 - goes_on) * unsure for n in sizes}
    return sizes, _yields({n: (p, [sure] * (n - 1) + [last[n]]) for n, p in sizes.items()})


def _yields(chains: dict[int, tuple[float, list[float]]]) -> dict[int, float]:
    """Tokens yielded by probability, from chains[n] = (probability, each position's acceptance)."""
    out: dict[int, float] = {}
    for n, (p, accept) in chains.items():
        reach = p  # the chance the walk accepts every position before this one
        for k, a in enumerate(accept, 1):
            out[k] = out.get(k, 0.0) + reach * (1 - a)
            reach *= a
        out[n + 1] = out.get(n + 1, 0.0) + reach
    return out


def check_sizes(round_yields: dict[int, float], gamma: int) -> dict[int, float]:
    """How many tokens a check holds, by probability, that takes every token of the rounds below once they
    reach gamma (engine.py: `_check_chain`), each round yielding k tokens with probability round_yields[k]."""
    reached = {0: 1.0}  # partial sums below gamma, by the probability the rounds pass through them
    sizes: dict[int, float] = {}
    for total in range(gamma):
        p = reached.pop(total, 0.0)
        for k, q in round_yields.items():
            into = sizes if total + k >= gamma else reached
            into[total + k] = into.get(total + k, 0.0) + p * q
    return sizes


def seconds_per_token(stack: tuple[str, ...], gammas: tuple[int, ...], costs: dict[str, dict[int, float]],
                      alphas: dict[str, float], row_seconds: float = 0.0, stops: bool = False) -> float:
    """The model of the module docstring: `stack` tier names cheapest first, `gammas` one per check,
    `costs[name]` seconds by tokens per forward, `alphas[name]` how often that tier's tokens are accepted,
    `row_seconds` the sampling processing of one row of logits (every forward's rows pay it). With `stops`
    the bottom tier's chains end early (`stop_below`), at its STOP_RATES in `alphas` (`stop_names`). A check
    above a tier that checks takes every token of its rounds, so it holds gamma or more (`check_sizes`);
    every check's cost and yield are averaged over the sizes it may have."""
    seconds = interpolate(costs[stack[0]], 1) + row_seconds
    below: dict[int, float] | None = None  # what the checks of the level below yield, by probability
    for level, (proposer, checker, gamma) in enumerate(zip(stack, stack[1:], gammas)):
        if below is None and stops:
            sizes, below = stopped_chain_yields(gamma, *(alphas[name] for name in stop_names(proposer)))
            gained = sum(k * p for k, p in below.items())
        else:
            sizes, alpha = {gamma: 1.0} if below is None else check_sizes(below, gamma), alphas[proposer]
            gained = sum(p * expected_tokens(alpha, n) for n, p in sizes.items())
            # (the top level's yields feed no level above: a plan's costliest part)
            below = check_yields(alpha, sizes) if level + 2 < len(stack) else None
        held = sum(n * p for n, p in sizes.items())
        check = held * seconds + sum(p * (interpolate(costs[checker], n + 1) + (n + 1) * row_seconds)
                                     for n, p in sizes.items())
        seconds = check / gained
    return seconds


@dataclass(frozen=True)
class Plan:
    stack: tuple[str, ...]  # tier names, cheapest first; the last is the target
    gammas: tuple[int, ...]  # tokens per check at each level above the bottom
    tokens_per_s: float  # what the model predicts
    stop_below: float = 0.0  # the bottom tier's chains end after a proposal it was less sure of (engine.py)
    # What the best stack with a draft this plan leaves idle (with two drafts, the one it does not run) is
    # predicted to reach over this plan (at the optimistic acceptance, which is what would make the planner
    # take it); 0: no idle draft
    draft_upside: float = 0.0
    # The idle drafts predicted to gain (their best stack's speed above this plan's), which are worth watching;
    # None: every idle draft (a plan made by no planner's scores)
    watch: tuple[str, ...] | None = None

    @property
    def mode(self) -> str:
        return stack_mode(self.stack)

    def to_dict(self) -> dict:
        return {"mode": self.mode, "gammas": list(self.gammas), "stop_below": self.stop_below,
                "predicted_tokens_per_s": round(self.tokens_per_s, 2)}


@dataclass
class Acceptance:
    """A proposer's per-token acceptance: successes over trials of the geometric model, with a prior worth
    `prior_trials` trials."""
    prior: float
    prior_trials: float = PRIOR_TRIALS
    successes: float = 0.0
    trials: float = 0.0

    def observe(self, gamma: int, accepted: int) -> None:
        self.successes += accepted
        self.trials += accepted + (accepted < gamma)

    def observe_expected(self, accepted: float, tokens: float) -> None:
        """Per-token evidence: `tokens` positions where the proposer's token would have been accepted
        `accepted` times in expectation (an idle draft's, auto.py)."""
        self.successes += accepted
        self.trials += tokens

    def forget(self, keep: float) -> None:
        """Older checks count less (text changes; an idle proposer drifts back to its prior and is retried)."""
        self.successes *= keep
        self.trials *= keep

    @property
    def mean(self) -> float:
        return (self.successes + self.prior_trials * self.prior) / (self.trials + self.prior_trials)

    @property
    def optimistic(self) -> float:
        """The mean plus a standard deviation of it, at most 0.99 (or the mean, where that is above: a tier
        measured at 200 of 200 is not rated below what it showed). A prior a hair above 1 (a priors file's
        float rounding) has no negative variance."""
        m = self.mean
        return max(m, min(m + math.sqrt(max(0.0, m * (1 - m)) / (self.trials + self.prior_trials)), 0.99))

    @property
    def observed(self) -> float | None:
        """The acceptance of the checks seen (faded as they are), without the prior; None with too few."""
        return self.successes / self.trials if self.trials >= MIN_TRIALS else None
