"""`--mode auto`: a per-request cost model (planning.py) picks which tiers run and their gammas, and
re-decides as the context grows or acceptance changes.

Re-decided every REPLAN_ROUNDS rounds of the top tier, between rounds. Requests shorter than
MIN_PLANNED_TOKENS decode plainly. The first plan is made once the target holds the prompt (and, in a
batch, recalls what earlier requests of its kind and batch size saw: priors.py); at its end the request
adds what it saw.

While a batchmate prefills, each of this request's target forwards carries one of its prompt chunks
(a batch runs the cheapest tier waited at, and the chunks wait at the target): speculation that checks
more tokens per target forward amortises them. So what the planner learns from the request's own
forwards and rounds (forward_times.py: costs scaled towards what forwards took, the time between them;
planning.py: each mode's realized speed) leaves out those that ran beside such chunks; what a chunk adds
to a target forward is learned apart, and a plan is made again as soon as a batchmate's prefill begins or
ends, with that cost or without it. The time between forwards is the wall time alone; in a batch, where
that holds the batchmates' forwards too, the request's own part of it (runs.OwnTime).

An idle draft (the plan runs `ar` or `retrieval`, or the other draft where it holds two) still tells the
planner how it would fare: at each re-plan it catches up on the tokens committed since (as it must before it
runs again anyway) with its logits kept, and for each committed token x, drawn from the target's distribution
p, min(1, q(x) / p(x)) with q the draft's distribution there, mixed with the prompt lookup's copy as a chain
would have proposed it (the copy and the lookup's weight at that position), is an unbiased estimate of the
chance that the draft's proposal there is accepted (its expectation over x ~ p is sum_x min(p(x), q(x));
greedy: whether the mixture's argmax is x); and where chains end early (`stop_below`), whether its top
probability there would have let a chain go on, and those estimates apart for positions it was sure of or not
(speed_model.STOP_RATES). Without the copies it rated the draft 0.28-0.36 in `ar` at 32K of Emma (SmolLM2,
yarn:4, greedy), where `draft` mode's checks fitted 0.73 and led (docs/cli.md, Longer contexts). So a draft
that a few early checks made look poor is tried again as soon as the text shows it would pay, not after its
estimate has faded back to the prior (56-72 tokens of `ar` in the runs that found it); it costs one forward of
the draft per REPLAN_ROUNDS target steps (its window was prefilled with the prompt), which the running plan's
measured speed leaves out. It watches only while that can pay: a plan under which the best stack with the
draft is predicted (at the optimistic acceptance, as plans are chosen) to gain nothing leaves it unwatched,
and once a watch has shown what watching costs per generated token, so does one predicted to gain less than
that cost as a fraction of the plan's measured time per token (a heuristic: evidence could still lift the
optimism, but the optimism already holds the doubt, and a longer context that slows the target lowers the
fraction; a request whose plans all predict no gain gives its draft no evidence, and only a later plan's
upside, or later requests' priors, can open the gate). The Qwen pair in a batch of four at 8K on the AVX2 EPYC
ran `ar` throughout while watching the 0.5B draft cost about a fifth of the decode (auto 0.83x `ar`; with the
gate 0.886x in one run, 0.95x the median of three); a small draft beside a long context costs a few percent
and is watched as before.

Exactness: each round is an exact sample of the target given the committed prefix whatever the stack
(every stack is exact, engine.py), and a plan only changes between rounds. A tier that joins catches up
on the tokens committed while it was idle (the draft: forwards over them; the retrieval tier: a sync).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Generator

import torch

from ..speculation.sampling import row_argmax, top_probabilities
from .engine import HierarchyEngine
from .runs import Forward, OwnTime, Run
from .forward_times import role_at, row_seconds
from .metrics import RequestMetrics, TierStats
from .planning import AutoPlanner
from .priors import request_key
from .speed_model import Plan, has_draft, is_draft
from .tiers import Tier

REPLAN_ROUNDS = 8
MIN_PLANNED_TOKENS = 32  # shorter requests decode plainly: measuring costs would take longer than they save


class AutoEngine(HierarchyEngine):
    """The hierarchy of whichever of its tiers the planner picks, re-picked between rounds (see above)."""

    def __init__(self, ladder: list[Tier], planner: AutoPlanner, lookup: int = 0):
        """ladder: the request's tiers cheapest first, the target last; lookup: HierarchyEngine's. Each plan
        carries its stop_below (the planner's, or the user's: AutoPlanner.fixed_stop)."""
        super().__init__([ladder[-1]], [], lookup=lookup)
        self.ladder, self.planner = list(ladder), planner
        self.rounds = 0  # rounds begun (a batchmate that has begun none may be measured with)
        self._pairs: dict[tuple[str, str], TierStats] = {}
        self._running: tuple[Plan, int, float] | None = None  # the plan running, since which token, when
        # what row processing was last timed on: random rows at the first plan, then the target's first row
        self._rows_timed_on: str | None = None
        self._adopted: dict | None = None  # the batch leader's decision this request last took
        self._shared = False  # whether a forward since the plan began ran beside another's prompt chunks
        self._planned_busy = False  # whether the running plan was made for a batchmate's prefill
        self._target_p: list[float] = []  # per generated token: the target's probability of it
        self._watch_seconds: float | None = None  # the latest watch's seconds per generated token it covered
        # The last forward: tier, role, rows its logits give, when it ended and whether beside batchmates (on
        # the wall clock alone, on `own` then; None after a plan, whose time and catch-up forwards are no
        # forward's overhead)
        self._last: tuple[str, str, int, float, bool] | None = None
        self.own = OwnTime()  # the seconds its run spends in its own code

    def run(self, prompt: list[int], params, *args, **kwargs) -> Run:
        """HierarchyEngine.run, adding what it saw to what later requests of its kind start from (its first
        plan recalls what earlier ones saw); a member of its batch meanwhile."""
        mates, self.prompt_length = self.planner.batchmates, len(prompt)
        if mates is not None:
            mates.join(self)
        try:
            generated, metrics = yield from self.own.timed(super().run(prompt, params, *args, **kwargs))
            self.planner.remember()
            if metrics.auto is None and params.max_tokens < MIN_PLANNED_TOKENS:  # the choice is in the metrics
                metrics.auto = [{"at_token": 0, "context": len(prompt), "mode": "ar", "gammas": [], "stop_below": None,
                                 "predicted_tokens_per_s": None, "why": {"max_tokens_below": MIN_PLANNED_TOKENS}}]
            return generated, metrics
        finally:
            if mates is not None:
                mates.leave(self)

    @property
    def plans(self) -> bool:
        """Whether this request plans (it is long enough) and its target holds its prompt, so that it may
        lead its batch and its tiers may be measured with a batchmate's."""
        params = getattr(self, "params", None)  # set once the run starts
        return params is not None and params.max_tokens >= MIN_PLANNED_TOKENS and self.prefilled

    def _busy(self) -> bool:
        """Whether a batchmate is prefilling, and what its chunks add to a target forward is known."""
        mates = self.planner.batchmates
        return mates is not None and self.planner.times.chunk_seconds is not None and \
            any(not e.prefilled for e in mates.engines if e is not self)

    def _prefill(self, tokens: list[int], show_progress: bool,
                 cancelled: Callable[[], bool]) -> Generator[Forward, None, bool]:
        """The target's prefill, the draft's (its window: a few hundred tokens), then the first plan and the
        prefill of the tiers it runs, all counted in the request's prefill time, as the prefill of a fixed
        mode's tiers is. The draft is prefilled whatever the plan: when it joins later its catch-up is
        then a few tokens, not its window in the middle of the decode (the Qwen pair at 8K, batch 4: 1.7 s
        of a 24 s decode, benchmarks/batch_timeline.py), and its costs are measured at its real context."""
        if not (yield from super()._prefill(tokens, show_progress, cancelled)):
            return False
        for draft in self._drafts() if self.plans else ():
            yield from self._catch_up(draft, len(self.seq) - 1)
        yield from self._replan(0)
        return True

    def _drafts(self) -> list[Tier]:
        """The request's draft tiers: the draft model's, the target's own (SELF_DRAFT_TIER), or both."""
        return [tier for name, tier in self.planner.tiers.items() if is_draft(name)]

    def _catch_up(self, tier: Tier, end: int) -> Generator[Forward, None, None]:
        """Forwards (logits unused) that bring an idle tier's cache through seq[:end]."""
        for step in tier.prefill_steps(self.seq[tier.length:end]):
            yield Forward(tier, self.ladder.index(tier), step, "none")

    def _before_round(self, generated: int, metrics: RequestMetrics) -> Generator[Forward, None, None]:
        self.rounds += 1
        mates = self.planner.batchmates
        if self.rounds % REPLAN_ROUNDS == 0 or (self._running is not None and self._busy() != self._planned_busy):
            yield from self._watch_idle_drafts(generated)
            yield from self._replan(generated)  # also as soon as a batchmate's prefill begins or ends
        elif mates is not None and self._running is not None and mates.plan not in (None, self._running[0]):
            yield from self._adopt(mates.plan, generated, mates.decision)  # the batch's leader re-planned
        self.stats = [self._pair(lower.name, upper.name, metrics) for lower, upper in zip(self.tiers, self.tiers[1:])]
        metrics.auto = self.planner.decisions or None

    def _replan(self, generated: int) -> Generator[Forward, None, None]:
        """Alone, or as its batch's leader: plans (for the batch). Another member: takes the batch's plan."""
        if self.params.max_tokens < MIN_PLANNED_TOKENS:
            return
        mates = self.planner.batchmates
        if self._running is None:  # the first plan, once the batch has joined
            batch = 1 if mates is None else mates.size(self.planner)
            self.planner.recall(request_key(self.ladder, self.params, batch, self.lookup_n, self.planner.fixed_stop,
                                            len(self.seq)), len(self.seq))
        self._planned_busy = self._busy()  # a follower's too: else it re-plans every round once it differs
        if mates is not None and mates.leader() is not self and mates.plan is not None:
            self.planner.fade(generated)
            yield from self._adopt(mates.plan, generated, mates.decision)
            return
        if self._rows_timed_on is None:  # the request's sampling settings: what a row of logits costs to process
            self.planner.row_seconds = row_seconds(self.rows.probs, self.ladder[-1].model.config.vocab_size)
            self._rows_timed_on = "random"
        if self._running is not None and generated > self._running[1] and not self._shared:
            ran, since, start = self._running
            tokens = generated - since
            self.planner.observe_rate(ran, tokens / (time.perf_counter() - start), tokens)
        # Measuring a batch size's costs takes seconds (a batch shrinks as its members end): worth it only
        # with as many tokens left as a request needs to be planned at all.
        measure = self.params.max_tokens - generated >= MIN_PLANNED_TOKENS
        plan = self.planner.plan(len(self.seq), generated, self._planned_busy, measure)
        if mates is not None:
            mates.plan, mates.decision = plan, self.planner.decisions[-1]
        yield from self._adopt(plan, generated)

    def _adopt(self, plan: Plan, generated: int, decision: dict | None = None) -> Generator[Forward, None, None]:
        """Runs `plan` from the next round: the tiers that join catch up on what was committed while they
        were idle. `decision`: the batch leader's record of it, kept in this request's too."""
        if decision is not None and decision is not self._adopted:
            self.planner.decisions.append({**decision, "at_token": generated, "from": "the batch's leader"})
            self._adopted = decision
        if decision is not None:  # the leader's plan, for the leader's batch: this planner's costs, batch size
            # and scores are those of its own last plan, so its forwards and speed teach it nothing (they
            # scaled a lone request's costs by a batch's calls, and judged the leader's mode by them)
            self.planner.times.evidence = False
        stack = [self.planner.tiers[name] for name in plan.stack]
        for tier in self.planner.tiers.values():  # (not only those it ran: a batch's leader may have measured
            if tier not in stack:  # an idle one of this request's with its own, which it keeps while it runs it)
                tier.release()  # a retrieval tier dropped, or swapped for another budget's, frees its cache
        for tier in stack:
            if tier not in self.tiers:
                yield from self._catch_up(tier, len(self.seq) - 1)
        self.tiers, self.gammas, self.stop_below = stack, list(plan.gammas), plan.stop_below
        # A draft's chains that run to gamma still say where they would have stopped, and how those tokens
        # fared: a stretch of `draft` mode (whose checks are rarely steep enough to stop) otherwise taught
        # the draft's acceptance but not the STOP_RATES that `triforce`'s plans are predicted from, so a poor
        # start of `draft` left `triforce` rated at its priors (SmolLM2 at 8K greedy on the Zen 4: 103
        # tokens/s predicted after 9 tokens where the target took 1 of 14 of the draft's, 74-79 measured)
        self.stop_watch = self.planner.stop_threshold if not plan.stop_below and has_draft(plan.stack) else 0.0
        self._running, self._shared, self._last = (plan, generated, time.perf_counter()), False, None
        self.planner.begin_stretch()

    def _emitted(self, tokens: list[int], rows: list) -> None:
        self._target_p += [float(row[token]) for token, row in zip(tokens, rows)]

    def _watch_idle_drafts(self, generated: int) -> Generator[Forward, object, None]:
        """Each idle draft the plan would watch catches up on the committed tokens, and what it would have
        proposed for the generated ones becomes acceptance evidence, where that can pay (the module
        docstring; with two drafts the plan's draft_upside is the larger idle one's, its `watch` those
        predicted to gain, and what watching costs is what watching them took)."""
        if self._running is None:
            return
        plan, since, began = self._running
        idle = [draft for draft in self._drafts() if draft not in self.tiers
                and (plan.watch is None or draft.name in plan.watch)]
        if not idle:
            return
        start = time.perf_counter()
        cost = 0.0  # what watching costs as a fraction of the plan's time per token, once a watch measured it
        if self._watch_seconds is not None and generated > since:
            cost = self._watch_seconds * (generated - since) / (start - began)
        if plan.draft_upside - 1 <= cost:
            return
        self._last, covered = None, 0
        for draft in idle:  # (each covers the same positions)
            covered = max(covered, (yield from self._watch(draft)))
        seconds = time.perf_counter() - start
        if covered:  # (per position the forwards covered, forced or not: what `cost` multiplies it by)
            self._watch_seconds = seconds / covered
        self._running = (plan, since, began + seconds)  # the running plan's measured speed leaves this out

    def _watch(self, draft: Tier) -> Generator[Forward, object, int]:
        """`draft` catches up on the committed tokens, its would-be proposals for the generated ones made
        acceptance evidence (_watch_idle_drafts); returns how many positions its forwards covered."""
        first, level = self.prompt_length, self.ladder.index(draft)  # (seq's index of the first generated token)
        yield from self._catch_up(draft, first - 1)  # rows that predict the prompt
        accepted = tokens = 0.0  # (tokens: the unforced of the positions covered)
        covered, stop = 0, self.planner.stop_threshold
        by_sureness = {True: [0.0, 0.0], False: [0.0, 0.0]}  # where chains end early: expected accepted, positions
        for step in draft.prefill_steps(self.seq[draft.length:-1]):  # rows that predict generated tokens
            begin = step.start + 1  # row i predicts seq[begin + i], after seq[:begin + i]
            covered += step.n
            logits = yield Forward(draft, level, step)
            # (before the rules, as a chain's stop reads them; NaN goes on, as there)
            sure = (~(top_probabilities(logits) < stop)).tolist() if stop else None
            q = self.rows.probs(self.rows.ruled_chain(logits, begin))
            for i, (row, at) in enumerate(zip(q, range(begin, begin + step.n))):
                if at in self.forced_at:  # no proposal: running proposers leave it out too (engine.py)
                    continue
                chance = min(1.0, float(self._as_proposed(row, at)[self.seq[at]]) / self._target_p[at - first])
                accepted += chance
                tokens += 1
                if stop:
                    kind = by_sureness[sure[i]]
                    kind[0], kind[1] = kind[0] + chance, kind[1] + 1
        self.planner.observe_idle(draft.name, accepted, tokens)
        if stop:  # how its chains would have ended there, by its top probability alone (a running chain
            # also goes on past a lookup's copy it drew, which this counts by the draft's confidence)
            self.planner.observe_idle_stops(draft.name, tuple(by_sureness[True]), tuple(by_sureness[False]))
        return covered

    def _as_proposed(self, row: torch.Tensor, at: int) -> torch.Tensor:
        """The bottom tier's distribution `row` for seq[at] as a chain would have proposed from it: mixed
        with the prompt lookup's copy there (speculation/lookup.py); greedy, its argmax as a one-hot."""
        if self.rows.lookup is not None:
            row = self.rows.lookup.offered(at, row)
        if self.params.greedy:
            row = torch.nn.functional.one_hot(row_argmax(row), row.shape[-1]).float()
        return row

    def _pair(self, drafter: str, checker: str, metrics: RequestMetrics) -> TierStats:
        if (drafter, checker) not in self._pairs:
            self._pairs[drafter, checker] = TierStats(checker, drafter)
            metrics.tiers.append(self._pairs[drafter, checker])
        return self._pairs[drafter, checker]

    def _forward(self, level: int, step=None) -> Generator[Forward, object, object]:
        tier, began = self.tiers[level], time.perf_counter()
        tokens, spent = step.n if step is not None else len(self.seq) - tier.length, tier.seconds
        together = self.planner.batchmates is not None and self.planner.batchmates.together
        if self._last is not None and self._last[4] == together:  # what ran since the last forward ended: its
            name, role, rows, ended, _ = self._last  # logits' processing and so on
            self.planner.times.observe_overhead(self.planner.running, name, role,
                                                (self.own.now() if together else began) - ended, rows,
                                                self.planner.row_seconds)
        logits = yield from super()._forward(level, step)
        seconds = tier.seconds - spent
        if tier.shared_prefill:  # a batchmate's prompt chunk slowed it: no evidence of this plan's speed
            self._shared = True
            if tier is self.ladder[-1]:
                self.planner.times.observe_chunk(tokens, seconds)
        else:
            self.planner.times.observe_cost(self.planner.running, tier.name, tokens, seconds)
        ended = self.own.now() if together else began + seconds
        self._last = None if tier.shared_prefill else \
            (tier.name, role_at(level), tokens if level else 1, ended, together)
        if self._rows_timed_on == "random" and tier is self.ladder[-1] and isinstance(logits, torch.Tensor) and \
                len(logits):
            # Random rows priced top-p as a sort of the whole vocabulary, where a model's row ranks its few
            # likely tokens (speculation/sampling.top_p_dropped): timed again on the target's, once
            timing = time.perf_counter()
            self.planner.row_seconds = row_seconds(self.rows.probs, logits.shape[-1], logits[-1:])
            self._rows_timed_on = "model"
            if self._last is not None:  # (that time is no forward's overhead)
                name, role, rows, ended, together = self._last
                self._last = (name, role, rows, ended + time.perf_counter() - timing, together)
        return logits

    def _record(self, level: int, proposed: int, accepted: int) -> None:
        super()._record(level, proposed, accepted)
        proposer = self.tiers[level - 1].name
        self.planner.observe(proposer, proposed, accepted)
        if level == 1 and (self.stop_below or self.stop_watch):  # (forced tokens are neither in `proposed` nor
            # in went_on)
            self.planner.observe_stopped_chain(proposer, self.went_on, accepted)
