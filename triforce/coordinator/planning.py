"""How `--mode auto` (auto.py) chooses: a cost model scores every stack of tiers and gammas from measured
forward costs and the acceptance seen so far; `AutoPlanner` keeps those estimates for one request.

The candidates are every stack the request has (`ar`: the target alone; `draft`; `retrieval`;
`triforce`) with gammas in 1..MAX_GAMMA, and with each of the retrieval budgets it holds a tier for
(hierarchy.auto_budgets: the configured one, twice and four times it), each once the context is at least
twice that budget (below that it reads nearly what the target reads). Each budget's tier has its own
acceptance estimate and costs; its modes are named with it (`triforce@8192`), the configured one's not.
With auto_self_draft a second draft tier, the target's own weights over a streaming window
(speed_model.SELF_DRAFT_TIER), is a candidate beside the draft model's in the same way (`draft@self`,
`triforce@self`).
Each is scored by the model of speed_model.py (seconds per token from forward costs and acceptance) and
the plan with the most tokens per second runs.
Plain decoding is one of the candidates, so a request where speculation does not pay runs `ar`. Within a
mode, the gammas the user set (gamma1, gamma2; by default 4 and 6) run unless others promise GAMMA_MARGIN
more: near its best the model's speed is flat in gamma while the real one is not smooth (at 4K of *Emma*,
greedy, fixed `draft` ran 71.9 / 77.6 / 59.3 / 55.3 / 79.1 tokens/s at gamma 3 / 4 / 5 / 6 / 8: which
positions begin a round), so a gamma the model prefers by a few percent is a guess, where the defaults
were swept.

Modes are compared at an optimistic alpha (mean + one standard deviation), so a tier that has been seen
little gets tried, and the estimate it then earns decides; but only plans whose speed at the mean alpha
beats plain decoding's (the running mode's: within SWITCH_MARGIN of it) are scored: faded evidence keeps
the optimistic bonus at a few percent, as large as the differences between modes where none pays much.
A mode's gammas are picked at the mean alpha: optimism is for trying tiers, and it favours long chains
(a proposal at depth k is accepted with probability alpha^k, so a higher alpha lifts the deep ones most;
SmolLM2 at 8K greedy on the AMX Xeon, `benchmarks/auto_why.py`: a request starting from an earlier one's
0.90, worth 12 trials, scored chains of 8 at an optimistic 0.98; in the grid such an opening's first 7
checks accepted 2 of their 56 proposals).
And before a plan expected to beat plain decoding by less than AR_PROBE, a request runs `ar` for one
stretch, so that the floor is measured, not assumed. Forward costs are the table's as this request's
forwards showed them, per mode, with the overhead between forwards per tier and role (forward_times.py);
what the model still leaves out is learned too: each mode's prediction is scaled by the speed it really
reached over the stretches it ran, pooled (realized.py), against what the model predicts for them at the
acceptance those stretches' own checks saw (so the factor holds only what the model leaves out: a
stretch of poor proposals lowers the acceptance estimate, not also the mode's factor); an untried
speculative mode by the mean of the speculative modes tried (none tried: by 1, but in a batch by `ar`'s,
if below 1); an idle mode's evidence fades as acceptance evidence does, with the tokens committed, back
towards where the mode started (alone: in a batch, whose rounds hold what the model leaves out, the calls
for fewer members and the batch's loop, the factors hold it). In a batch one plan serves every request (batchmates.py).

Where a check grows steeply with the tokens it holds (STEEP_CHECKS: vector arithmetic, not matrix tiles),
the draft's chains end early after a proposal its model was unsure of (`stop_below`, engine.py), and
the model prices the lengths they then have and their tokens' acceptance, sure or not (speed_model.STOP_RATES).

The running mode stays unless another promises SWITCH_MARGIN more. Costs are re-read when the context
moves past what they were measured at (the table measures once per machine, model, context and batch
size).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import product

from .batchmates import Batchmates, power_of_two_below
from .costs import CostTable, dense_costs, interpolate
from .forward_times import ForwardTimes
from .planner_evidence import PlannerEvidence
from .priors import Priors
from .realized import RealizedSpeed
from .speed_model import (PRIOR, PRIOR_GOES_ON, PRIOR_TRIALS, Acceptance, Plan, has_draft, is_draft, mode_stack,
                          prior, seconds_per_token, stack_mode, stop_names, tier_kind)
from .tiers import Tier

MAX_GAMMA = 8  # tokens per check the planner considers, per level
# Tokens per forward whose cost is measured (others interpolated): a target check above the retrieval tier
# holds up to gamma2 + gamma1 proposals, 2 MAX_GAMMA + 1 tokens with the next one.
CHECK_SIZES = (1, 2, 3, 4, 6, 9, 12, 17)
SWITCH_MARGIN = 1.05  # another mode must promise this much more than the running one to replace it
GAMMA_MARGIN = 1.15  # a mode runs gamma1 / gamma2 unless other gammas promise this much more (the docstring)
AR_PROBE = 1.25  # a request runs plain decoding for a stretch before a plan expected to beat it by less
STOP_BELOW = 0.3  # the bottom tier's chains end after a proposal it gave less than this probability...
STEEP_CHECKS = 1.3  # ...where a check of 4 tokens costs this many times one (docs/avx2.md)
STOP_MIN_GAMMA = 2  # with the stop on, the bottom tier's gamma (a cap then) is at least this: the stop ends
# chains where the draft is unsure, what a gamma of 1 does everywhere, confident stretches included
MAX_BATCH_LOG2 = 8  # batch sizes whose costs may stand in for an unmeasured one: 1, 2, 4, ..., 256


@dataclass
class AutoPlanner(PlannerEvidence):
    """Chooses a Plan for one request from measured costs and the acceptance seen so far (what it learns as
    the request runs: PlannerEvidence)."""
    tiers: dict[str, Tier]  # the request's tiers by name: "target", and "draft" / "retrieval" /
    # "retrieval@B" (one per candidate budget B: speed_model.retrieval_name) where it has them
    budget: int | None = None  # the configured retrieval budget (tier "retrieval"), None without one
    table: CostTable = field(default_factory=CostTable.default)
    acceptance: dict[str, Acceptance] = field(default_factory=lambda: {n: Acceptance(p) for n, p in PRIOR.items()})
    decisions: list[dict] = field(default_factory=list)  # each plan change: when, what, why
    realized: RealizedSpeed = field(default_factory=RealizedSpeed)  # per mode: tokens/s reached / predicted
    row_seconds: float = 0.0  # turning one row of logits into the request's distribution (measured per request)
    priors: Priors | None = None  # what earlier requests of this kind saw (None: start from PRIOR every time)
    batchmates: Batchmates | None = None  # the requests run together with this one (None: it runs alone)
    fixed_stop: float | None = None  # the request's stop_below where the user set one (None: chosen per plan)
    preferred_gammas: tuple[int, int] | None = None  # gamma1 and gamma2 (EngineConfig's: the user's or the
    # defaults), which a mode runs unless other gammas promise GAMMA_MARGIN more (None: the model picks)
    _stretch: dict[str, Acceptance] = field(default_factory=dict)  # per proposer: its checks since begin_stretch
    _key: str | None = None  # this request's kind, in `priors`
    _prior_source: str = "defaults"
    _generic: dict[str, float] = field(default_factory=dict)  # per proposer: the generic prior (`recall`)
    _batch: int = 1  # the batch size of the plan being made
    _keys: dict = field(default_factory=dict)  # per tier: the cost table's entry it read (`costs`)
    _recalled_batch: tuple = (1, False)  # its batch when it recalled its kind's priors (`_batch_state`)
    _ran_apart: bool = False  # whether a plan since was for another (its speed factors are then not its kind's)
    _faded_at: int = 0  # the request's generated tokens when its acceptance evidence last faded (`fade`)
    _probed: bool = False  # whether this request ran its `ar` probe (once, measured or not)
    times: ForwardTimes = field(init=False)  # what this request's forwards take (forward_times.py)

    def __post_init__(self):
        self.times = ForwardTimes(self.table)
        for name in self.tiers:  # a retrieval tier per candidate budget, each its own acceptance
            if tier_kind(name) != "target":
                self.acceptance.setdefault(name, Acceptance(prior(name)))
        for name in [name for name in self.acceptance if tier_kind(name) in PRIOR]:  # and where its chains end
            start = self.acceptance[name].prior  # early, its stop rates (speed_model.STOP_RATES)
            for rate, first in zip(stop_names(name), (PRIOR_GOES_ON, start, start)):
                self.acceptance.setdefault(rate, Acceptance(first))

    def candidates(self, context: int, busy: bool = False) -> list[tuple[str, ...]]:
        """The stacks worth scoring: each retrieval tier once the context is twice its budget; the one of the
        configured budget also while the target is busy with a batchmate's prefill (its checks then cost a
        chunk, the retrieval tier's not)."""
        drafts = [(name,) for name in self.tiers if is_draft(name)]
        retrievals = [(name,) for name in self.tiers if tier_kind(name) == "retrieval"
                      and (context >= 2 * self._budget(name) or (busy and name == "retrieval"))]
        below = [()] + drafts + retrievals + [draft + retrieval for retrieval in retrievals for draft in drafts]
        return [stack + ("target",) for stack in below]

    def _budget(self, name: str) -> int:
        """The budget of retrieval tier `name` (speed_model.retrieval_name)."""
        budget = name.partition("@")[2]
        return int(budget) if budget else self.budget

    def costs(self, stacks: list[tuple[str, ...]], measure: bool = True) -> dict[str, dict[int, float]]:
        """Seconds per forward call of each tier the stacks use, for a batch of `_batch` requests: from the
        table where it knows them; else, with `measure`, measured: this request's tier and the same tier of
        batchmates that have not begun to decode in one call (then `_batch` is as many as those make).
        Without `measure` (a few tokens are left: a batch that shrank as its members ended), those of the
        nearest batch size the table knows stand in, where it knows one."""
        needed = sorted({name for stack in stacks for name in stack})
        sizes = {name: (1,) if is_draft(name) else CHECK_SIZES for name in needed}
        mates = []
        self._batch = self.batch_size()

        def known(batch):
            return all(self.table.known(self.tiers[n], sizes[n], batch) for n in needed)

        if not measure and not known(self._batch):
            nearest = sorted((1 << k for k in range(MAX_BATCH_LOG2 + 1)), key=lambda b: abs(b - self._batch))
            self._batch = next((b for b in nearest if known(b)), self._batch)
        if not known(self._batch):
            measurable = [] if self.batchmates is None else self.batchmates.measurable(self)
            self._batch = min(self._batch, power_of_two_below(1 + len(measurable)))
            mates = measurable[: self._batch - 1]
        out, running = {}, mode_stack(self.running) if self.running else ()
        self._keys = {}
        for name in needed:
            group, synced = [self.tiers[name]] + [m.planner.tiers[name] for m in mates], []

            def sync(group=group, synced=synced):
                for tier in group:
                    tier.sync()
                    synced.append(tier)

            # An idle retrieval cache is measured as it would run: synced (a static one is built then), and
            # gives its memory back after (mode auto holds one per candidate budget and runs one at a time).
            try:
                out[name] = self.table.seconds(group, sizes[name], sync, self._batch)
                self._keys[name] = self.table.entry_key(self.tiers[name], self._batch)
            finally:  # also where a measurement failed: a batchmate whose tier it synced runs on
                for tier in synced if name not in running else ():
                    tier.release()
        return out

    @property
    def running(self) -> str | None:
        return self.decisions[-1]["mode"] if self.decisions else None

    def plan(self, context: int, generated: int, busy: bool = False, measure: bool = True) -> Plan:
        """The best plan at this context; recorded in `decisions` when it differs from the last. `busy`: a
        batchmate is prefilling, so each target forward also carries one of its prompt chunks (what that
        adds is `chunk_seconds`): fewer target forwards per token pay more then. `measure`: whether costs
        the table lacks may be measured now (`costs`)."""
        busy = busy and self.times.chunk_seconds is not None  # a chunk's cost unknown yet: planned as quiet
        stacks, running = self.candidates(context, busy), self.running
        self.fade(generated)
        wanted = self.batch_size()
        costs = self.costs(stacks, measure)
        # Another batch size's costs standing in: what this plan's forwards and speed show is no evidence
        self.times.plan_with(costs, self._batch, stacks, evidence=measure or self._batch == wanted, keys=self._keys,
                             ran_batch=wanted)
        chunk = self.times.chunk_seconds if busy else 0.0
        estimates = self.estimates()
        optimistic = {name: a.optimistic for name, a in estimates.items()}
        means = {name: a.mean for name, a in estimates.items()}

        # Each stack's costs once per plan, at every size a check of these gammas holds (at most gamma1 +
        # gamma2 tokens, and the bonus): the model asks them of hundreds of plans (a replan at 16K had taken
        # 62 ms, most of it in these lookups and in rebuilding each stack's table per gammas)
        top, tables, stops = 2 * max((MAX_GAMMA, *(self.preferred_gammas or ()))) + 2, {}, {}

        def speed(stack, gammas, alphas):  # tokens/s the model predicts, as this mode realizes it
            if stack not in tables:
                tables[stack] = dense_costs(self.times.per_sequence(stack, chunk), top)
                stops[stack] = bool(self._stop_below(stack))
            return self._realized(stack_mode(stack)) / seconds_per_token(stack, gammas, tables[stack], alphas,
                                                                         self.row_seconds, stops[stack])

        plain = speed(("target",), (), means)
        scored, expected, with_draft = {}, {}, {}  # with_draft: per draft tier, its best stack's optimistic speed
        for stack in stacks:
            mode, anchor = stack_mode(stack), self._anchor(stack)
            shortest = STOP_MIN_GAMMA if self._stop_below(stack) else 1
            options = set(product(range(1, MAX_GAMMA + 1), repeat=len(stack) - 1)) | ({anchor} if anchor else set())
            paying = {}  # gammas -> tokens/s at the mean acceptance, of the plans expected to pay
            for gammas in options:
                if gammas and gammas[0] < shortest:
                    continue
                mean_rate = speed(stack, gammas, means)
                expected[mode] = max(expected.get(mode, 0.0), mean_rate)
                if has_draft(stack):
                    with_draft[stack[0]] = max(with_draft.get(stack[0], 0.0), speed(stack, gammas, optimistic))
                if len(stack) == 1 or mean_rate >= plain / (SWITCH_MARGIN if mode == running else 1.0):
                    paying[gammas] = mean_rate  # speculation must be expected to pay
            if paying:  # the mean picks the gammas, optimism the mode (the module docstring)
                gammas = max(sorted(paying), key=paying.get)
                if anchor in paying and GAMMA_MARGIN * paying[anchor] >= paying[gammas]:
                    gammas = anchor  # the model's gain from other gammas is within its error
                scored[mode] = (speed(stack, gammas, optimistic), gammas, stack)
        rate, gammas, stack = max(scored.values())
        best = Plan(stack, gammas, rate)
        if running in scored and best.mode != running and best.tokens_per_s < SWITCH_MARGIN * scored[running][0]:
            kept, gammas, stack = scored[running]  # not better enough to pay a switch, or to chase noise
            best = Plan(stack, gammas, kept)
        probe = not self._probed and best.mode != "ar" and "ar" not in self.realized.measured \
            and expected[best.mode] < AR_PROBE * plain
        if probe:  # plain decoding is the floor: know its speed here before settling on a plan near it (once:
            # a stretch beside a batchmate's prefill measures nothing, and the probe came back every plan)
            best, self._probed = Plan(("target",), (), plain), True
        idle = {name: rate for name, rate in with_draft.items() if name != best.stack[0]}  # (of two drafts, one runs)
        upside = max(idle.values()) / best.tokens_per_s if idle else 0.0
        watch = tuple(name for name, rate in idle.items() if rate > best.tokens_per_s)
        best = replace(best, stop_below=self._stop_below(best.stack), draft_upside=upside, watch=watch)
        last = self.decisions[-1] if self.decisions else {}
        if [last.get(k) for k in ("mode", "gammas", "stop_below")] != [best.mode, list(best.gammas), best.stop_below]:
            why = {"predicted_tokens_per_s": {m: round(r, 2) for m, (r, _, _) in scored.items()},
                   "expected_tokens_per_s": {m: round(r, 2) for m, r in expected.items()}, "probe": probe,
                   "acceptance": {n: round(a.mean, 3) for n, a in estimates.items()  # (stop rates once seen,
                                  if tier_kind(n) in PRIOR or a.trials or a.prior_trials != PRIOR_TRIALS},  # or recalled)
                   "draft_upside": round(best.draft_upside, 3),
                   "batchmate_chunk_ms": round(1e3 * chunk, 2)}
            self.decisions.append({"at_token": generated, "context": context, **best.to_dict(),
                                   "why": {**why, **self._state()}})
        return best

    def _state(self) -> dict:
        """What the planner held at a decision, for its record: priors, batch, cost scales and costs."""
        return {"prior": self._prior_source, "batch": self._batch,
                "realized": {m: round(x, 3) for m, x in self.realized.items()},
                "row_ms": round(1e3 * self.row_seconds, 3), **self.times.state()}

    def _anchor(self, stack: tuple[str, ...]) -> tuple[int, ...] | None:
        """The preferred gammas of `stack` (gamma1 for the draft's chains, gamma2 for the retrieval tier's),
        or None where there are none."""
        if self.preferred_gammas is None:
            return None
        return tuple(self.preferred_gammas[0] if is_draft(name) else self.preferred_gammas[1] for name in stack[:-1])

    @property
    def stop_threshold(self) -> float:
        """The `stop_below` of the plans that stop chains early (`_stop_below`): the user's, else STOP_BELOW."""
        return STOP_BELOW if self.fixed_stop is None else self.fixed_stop

    def _stop_below(self, stack: tuple[str, ...]) -> float:
        """The bottom tier's `stop_below` on `stack`: the user's where set; else, where the draft proposes,
        STOP_BELOW where the tier that checks its chains costs STEEP_CHECKS times as much for 4 tokens as
        for 1 (the costs planned with), and 0 otherwise (with tiles a longer check costs about what a
        shorter one does, and ending chains early only loses tokens). A retrieval tier's chains run to
        gamma: it samples nearly the target's own rows, so its unsure tokens are accepted about as often as
        its sure ones (0.936 against 0.958 at 8K and 0.6 on the Zen 4), and `retrieval` mode with the stop ran
        0.91x without it in a batch of four (docs/auto.md: "The stop does not fit the retrieval tier")."""
        if self.fixed_stop is not None:
            return self.fixed_stop
        check = self.times.scaled.get(stack_mode(stack), {}).get(stack[1]) if has_draft(stack) else None
        if not check:
            return 0.0
        return self.stop_threshold if interpolate(check, 4) >= STEEP_CHECKS * interpolate(check, 1) else 0.0
