"""What `--mode auto`'s planner (planning.py) learns as a request runs, and from earlier requests: each
proposer's acceptance (its checks, an idle proposer's expected evidence, the priors of its request kind),
how each mode's speed compares with the model's prediction, and how all of it fades as the text moves on.
`PlannerEvidence` is a part of AutoPlanner, which holds the `acceptance`, `realized`, `times`, `priors`,
`batchmates` and `_stretch` these keep."""
from __future__ import annotations

from .priors import LEARNED_TRIALS
from .speed_model import Acceptance, Plan, prior, seconds_per_token, stop_names, stop_trials, tier_kind

EVIDENCE_KEPT = 0.85  # of the acceptance evidence, for each EVIDENCE_TOKENS tokens committed since it was
EVIDENCE_TOKENS = 8  # seen (a memory of about 50 tokens; an idle mode's factor and costs: at each plan)


class PlannerEvidence:
    def fade(self, generated: int) -> None:
        """At each plan (in a batch, at each member's), `generated` tokens into the request: older acceptance
        evidence counts less, by the tokens committed since the last plan (the text it was seen on is that
        far behind); so does an idle mode's measured speed, back towards its start (alone; in a batch it
        holds: realized.py), and its cost scales towards the tiers' own, and an idle tier's cost scale towards
        the table (a tier that a slow spell made look dear is tried again, as a proposer a bad start made look
        poor is).
        Per plan, as the acceptance faded before, a plan of `ar` (REPLAN_ROUNDS tokens) forgot as much as
        one of `triforce` (about 50): SmolLM2 + yarn:4 at 32K of Emma, greedy, on the AVX2 EPYC, the draft
        rejected in the first 31 tokens was still rated 0.77 at token 95, though the retrieval tier took every
        one of its proposals from token 31 on (96 of 96 by token 183), and `draft` mode, 1.10x auto's
        speed there, ran only from token 183. Still all evidence fades here at once, so the checks of the
        stretch this plan ends fade as much as older ones (after 50 tokens of `triforce`, to 0.36 against
        the prior). Fading each check by its own age instead (7793651, a longer memory) ran 0.92x this at
        8K and 0.6 (six seeds) and 0.96x at 32K greedy in an A/B on the AVX2 EPYC: reverted (docs/avx2.md)."""
        running, moved, self._faded_at = self.running, generated - self._faded_at, generated
        self._ran_apart |= self._apart()  # (`remember`)
        kept = EVIDENCE_KEPT ** (moved / EVIDENCE_TOKENS)
        for estimate in self.acceptance.values():
            estimate.forget(kept)
        # In a batch the factors carry what the model leaves out of its rounds (`_together`), which an idle
        # mode's does not lose: at batch 2 on the AVX2 EPYC, `draft` measured at 0.8 of its model faded back
        # within 3 plans of `ar` and ran again.
        self.realized.fade(running, None if self._together else kept, self._together)
        self.times.fade(running, EVIDENCE_KEPT)

    def estimates(self) -> dict[str, Acceptance]:
        """The acceptance plans are scored with: this request's, or in a batch its prefilled members' pooled."""
        return self.acceptance if self.batchmates is None else self.batchmates.pooled(self)

    def begin_stretch(self) -> None:
        """A plan starts running (or runs on after a re-plan): its checks from now on are its stretch's."""
        self._stretch = {}

    def observe(self, proposer: str, gamma: int, accepted: int) -> None:
        self.acceptance[proposer].observe(gamma, accepted)
        self._stretch.setdefault(proposer, Acceptance(0.0, 0.0)).observe(gamma, accepted)

    def observe_idle(self, proposer: str, accepted: float, tokens: float) -> None:
        """An idle proposer's expected acceptance over `tokens` committed tokens (auto.py)."""
        self.acceptance[proposer].observe_expected(accepted, tokens)

    def observe_stopped_chain(self, proposer: str, went_on: list[bool], accepted: int) -> None:
        """A check accepted `accepted` tokens of a chain that `proposer` may have ended early (`stop_below`),
        which went on past its tokens as `went_on` says: evidence of its STOP_RATES (speed_model.stop_names),
        each token that the check reached one trial of the acceptance of its kind, sure or not."""
        goes_on, sure, unsure = stop_names(proposer)
        self._observe(goes_on, sum(went_on), len(went_on))
        for was_sure, ok in stop_trials(went_on, accepted):
            self._observe(sure if was_sure else unsure, float(ok), 1.0)

    def observe_idle_stops(self, proposer: str, sure: tuple[float, float], unsure: tuple[float, float]) -> None:
        """Of the positions an idle proposer would have been sure (unsure) of, `sure` (`unsure`) gives the
        expected accepted and how many (auto.py): evidence of its STOP_RATES, as its chains would have run."""
        goes_on, *kinds = stop_names(proposer)
        self.acceptance[goes_on].observe_expected(sure[1], sure[1] + unsure[1])
        for name, (accepted, positions) in zip(kinds, (sure, unsure)):
            self.acceptance[name].observe_expected(accepted, positions)

    def _observe(self, name: str, successes: float, trials: float) -> None:
        self.acceptance[name].observe_expected(successes, trials)
        self._stretch.setdefault(name, Acceptance(0.0, 0.0)).observe_expected(successes, trials)

    def recall(self, key: str, context: int | None = None) -> None:
        """Starts the request of kind `key` from what earlier ones saw (priors.py), where they saw it; else
        from the generic priors, a retrieval tier's for its budget at this `context` (speed_model.prior)."""
        self._key = key
        for name, estimate in self.acceptance.items():
            if tier_kind(name) == "retrieval" and not estimate.trials:
                self.acceptance[name] = Acceptance(prior(name, self._budget(name), context))
        self._generic = {name: estimate.prior for name, estimate in self.acceptance.items()}
        self._recalled_batch = self._batch_state()  # its kind's key holds the batch size then (request_key)
        if self.priors is None:
            return
        known = self.priors.recall(key)
        for name, mean in known["acceptance"].items():
            if name in self.acceptance:
                self.acceptance[name] = Acceptance(mean, LEARNED_TRIALS)
        self.realized.recall(known["realized"])
        self.times.overhead.update(known["overhead"])
        if known["acceptance"]:
            self._prior_source = "earlier requests"
        elif known["realized"]:  # (a kind none ran yet: its kin's, priors.Priors.recall)
            self._prior_source = "speed factors of earlier requests"

    def remember(self) -> None:
        """The request ends: what it saw joins what later requests of its kind start from; a cost-table
        entry its forwards found far off is measured again by the next (ForwardTimes.remeasure)."""
        self.times.remeasure()
        if self.priors is None or self._key is None:
            return
        seen = {name: a.observed for name, a in self.acceptance.items()}
        # Its modes' speed factors belong to its kind where it planned as that kind did, alone or in a batch
        # (a request recalled alone whose batchmates came later measured factors that carry their forwards),
        # and where it holds any: a batch member that ran its leader's plans measured none, and passing that
        # on as "ran nothing" drifted the leader's factors back towards 1 once per member (batch 8 at 0.6 on
        # the AMX Xeon: `triforce` measured at 0.70 of its model was remembered as 1.0, and the next batch
        # ran it for 47 of its 128 tokens again)
        realized = None if self._ran_apart else self.realized.own() or None
        self.priors.remember(self._key, seen, realized, self._generic, self.times.overhead)

    def batch_size(self) -> int:
        """The batch size it plans for now (Batchmates.size; 1 alone)."""
        return 1 if self.batchmates is None else self.batchmates.size(self)

    def _batch_state(self) -> tuple[int, bool]:
        """The batch size it plans for and whether it runs with batchmates at all (one still prefilling, or
        too short to plan, is not counted in the size, and its forwards run beside this one's)."""
        return self.batch_size(), self._together

    def _apart(self) -> bool:
        """Whether it now plans as another kind than it recalled (its speed factors are then not its kind's):
        with batchmates where it recalled alone, or for a larger batch. Not for one that shrank as its members
        ended, down to its last member alone: a batch of 8 plans for 4 once one has ended, and at 0.6, where
        members reach their last token rounds apart, a leader that planned once more then forgot its factors
        in some batches and not in others (and one that outlived its batchmates, alone for its last plan,
        still did on a loaded machine: the suite's one failure at 5343999). (Near the end, where the table
        lacks the smaller batch's costs, its plans are no evidence: AutoPlanner.costs.)"""
        (size, together), (recalled_size, recalled_together) = self._batch_state(), self._recalled_batch
        return (together and not recalled_together) or size > recalled_size

    @property
    def _together(self) -> bool:
        """Run with batchmates (Batchmates.together): the realized factors carry what the model leaves out
        of a batch's rounds."""
        return self.batchmates is not None and self.batchmates.together

    def _realized(self, mode: str) -> float:
        """How `mode`'s speed compares with its prediction (RealizedSpeed.factor)."""
        return self.realized.factor(mode, self._together)

    def observe_rate(self, plan: Plan, tokens_per_s: float, tokens: int) -> None:
        """The request ran `plan` at `tokens_per_s` (its rounds' wall time: forwards and all the sampling,
        verification and bookkeeping between them) over the `tokens` it committed since the last plan.
        Against what the model predicts for that plan at the acceptance its checks saw since then (a proposer
        not checked meanwhile: its estimate) and the costs as the stretch's own forwards scaled them (per
        sequence of the batch), this mode's later predictions are scaled likewise (realized.py). (Against the
        costs planned with, a stretch of forwards slower than those moved both the costs and this factor, and
        the next plan counted it twice.)"""
        if plan.mode not in self.times.scaled or not self.times.evidence:
            return  # a plan this planner did not score, or made with another batch size's costs
        predicted = self.predicted(plan, self.times.per_sequence(plan.stack, now=True), stretch=True)
        self.realized.observe(plan.mode, tokens_per_s * self._batch / predicted, tokens)

    def predicted(self, plan: Plan, costs: dict[str, dict[int, float]], stretch: bool = False) -> float:
        """The tokens/s the model gives `plan` at `costs`, at the acceptance estimates (with `stretch`, a
        proposer checked in the running stretch: at what its checks saw), its chains ending early where
        `plan` says so."""
        alphas = {name: a.mean for name, a in self.estimates().items()}
        if stretch:
            alphas.update({name: a.mean for name, a in self._stretch.items() if a.trials})
        return 1.0 / seconds_per_token(plan.stack, plan.gammas, costs, alphas, self.row_seconds, bool(plan.stop_below))
