"""What mode auto's planner (planning.py) knows of how often a proposer's tokens are accepted.

`Acceptance`: successes over trials of the geometric model (a chain check that accepted a of its g tokens
is a successes and one failure if a < g), with a prior worth some trials. `AcceptanceByGamma`: one
proposer's checks kept apart by the gamma its level ran at, since the checks at one gamma do not tell the
acceptance at another. Which positions begin a round depends on gamma (a round begins after the position
its checker filled), and a round's first proposal fares differently there: SmolLM2's draft checked by the
retrieval tier, float32 greedy on *Emma* (`python benchmarks/round_positions.py`), got the same verdict at
each of the 26 positions where rounds of gamma 2 and of gamma 4 both began, yet first proposals were
accepted 0.81 of the time at gamma 2 against 0.88 at gamma 4; at temperature 0.6 (8K prompt, three seeds)
the geometric alpha fitted to gamma 4's checks was 0.58-0.76 against 0.48-0.63 at gamma 2's. A planner
that had run gamma 2 only priced gamma 4 at gamma 2's alpha, kept gamma 2 and ran at 0.72-0.80x of
gamma 4's speed. So a gamma is scored from its own checks once it has some (the pooled estimate their
prior), and a longer gamma never run is tried once where the model, at the pooled alpha, puts it near the
best (planning.EXPLORE_MARGIN).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .priors import MIN_TRIALS

PRIOR = {"draft": 0.6, "retrieval": 0.85}  # per-token acceptance before any check...
PRIOR_TRIALS = 4.0  # ...worth this many trials
GAMMA_PRIOR_TRIALS = 8.0  # a gamma's own checks start from the proposer's pooled estimate, worth this many


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
        m = self.mean
        return min(m + math.sqrt(m * (1 - m) / (self.trials + self.prior_trials)), 0.99)

    @property
    def observed(self) -> float | None:
        """The acceptance of the checks seen (faded as they are), without the prior; None with too few."""
        return self.successes / self.trials if self.trials >= MIN_TRIALS else None


@dataclass
class AcceptanceByGamma:
    """One proposer's checks by the gamma of its level in the plan they ran under (evidence only)."""
    checks: dict[int, Acceptance] = field(default_factory=dict)

    def observe(self, gamma: int, proposed: int, accepted: int) -> None:
        self.checks.setdefault(gamma, Acceptance(0.0, 0.0)).observe(proposed, accepted)

    def forget(self, keep: float) -> None:
        for estimate in self.checks.values():
            estimate.forget(keep)

    def tried(self, gamma: int) -> bool:
        return gamma in self.checks

    def at(self, gamma: int, pooled: Acceptance) -> Acceptance:
        """The estimate at `gamma`: its own checks over the pooled estimate as prior; the pooled one where
        it has none."""
        own = self.checks.get(gamma)
        if own is None or own.trials <= 0:
            return pooled
        return Acceptance(pooled.mean, GAMMA_PRIOR_TRIALS, own.successes, own.trials)
