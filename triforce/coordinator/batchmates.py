"""The requests run together now, and the one plan they run (`--mode auto`, planning.py).

In a batch (LLM.generate's prompts, a server's running requests) one plan serves every request (`Batchmates`):
its leader, the first request that plans, makes it from the acceptance of all members' checks and priors
pooled (`pooled`), and from what a forward of the batch costs: c_t(n) is then the seconds of one call that
runs tier t of B requests, n tokens each, over B, so a mode is scored by the tokens per second of the whole
batch. B is the members that plan, rounded down to a power of two (a batch that shrinks as requests end is
measured a few times, not at every size); a cost the table lacks is measured with batchmates that have not
begun to decode, or alone. At batch 8 the weights are read once for eight sequences and each one's KV cache is
what costs, which favours the retrieval tier over the draft where one sequence alone would not.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .speed_model import Acceptance

if TYPE_CHECKING:
    from .planning import AutoPlanner
    from .speed_model import Plan


def power_of_two_below(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


@dataclass(eq=False)
class Batchmates:
    """The requests run together now, by their engines (AutoEngine.run joins at its start, leaves at its
    end), and the plan they all run: one stack and gammas for the batch, so that every forward carries
    all of them (sequences on different stacks or gammas would wait for each other's tiers). Its leader,
    the first member whose prompt is prefilled, makes it; the others take it between their rounds."""
    engines: list = field(default_factory=list)
    plan: Plan | None = None
    decision: dict | None = None  # the leader's record of the plan, and why

    def join(self, engine) -> None:
        self.engines.append(engine)

    def leave(self, engine) -> None:
        self.engines.remove(engine)
        if not self.engines:  # the next batch plans afresh
            self.plan = self.decision = None

    @property
    def together(self) -> bool:
        """More than one request runs: the time between one's forwards holds the others' forwards, so its
        overhead between them is its run's own time (runs.OwnTime, AutoEngine._forward), and the realized
        factors carry what the model leaves out of a batch's rounds (its calls for fewer members, its loop)."""
        return len(self.engines) > 1

    def leader(self):
        return next((e for e in self.engines if e.plans), None)

    def others(self, planner: "AutoPlanner") -> list:
        """The members planned with `planner`'s request: those prefilled that plan, but its own."""
        return [e for e in self.engines if e.planner is not planner and e.plans]

    def size(self, planner: "AutoPlanner") -> int:
        """The batch size `planner` plans for: its request and the others, rounded down to a power of two."""
        return power_of_two_below(1 + len(self.others(planner)))

    def measurable(self, planner: "AutoPlanner") -> list:
        """The others whose tiers a batch cost may be measured with: only those that have not begun to
        decode (a member in the middle of a round holds speculative entries that filler tokens, rolled
        back after, could overwrite: a retrieval cache writes into its target's free slots) and
        whose caches are settled (a draft catching up on a long prompt skipped to its last window, whose
        forward has not run yet: filler rolled back there fell into the skipped tokens, a ValueError)."""
        return [e for e in self.others(planner) if e.rounds == 0 and
                all(t.cache is None or t.cache.settled for t in e.planner.tiers.values())]

    def pooled(self, planner: "AutoPlanner") -> dict[str, Acceptance]:
        """Each proposer's acceptance over the checks of `planner`'s request and the others', each member's
        prior counted too (B members, B priors: the pooled estimate of B alike members is what each holds). With
        one prior for the batch, its weight shrank B-fold against checks that come B times as fast: at batch 8
        an opening's few poor checks outweighed it for about three times the tokens they did alone (by the
        fading's arithmetic; an idle draft that started badly waited ~100 tokens to be tried again), and a
        remembered prior worth 12 trials kept one request's optimism (Acceptance.optimistic): the retrieval
        tier's remembered 0.939 was scored at 0.99, and `triforce` opened where `draft` was faster."""
        members = [planner] + [e.planner for e in self.others(planner)]
        return {name: Acceptance(a.prior, sum(m.acceptance[name].prior_trials for m in members),
                                 sum(m.acceptance[name].successes for m in members),
                                 sum(m.acceptance[name].trials for m in members))
                for name, a in planner.acceptance.items()}
