"""`--mode auto`'s planner (planning.py) on given costs: which stack, gammas and budget it picks, and
when it switches. What it learns from what it observes: test_planner_learning.py."""
import copy

import pytest

import triforce.coordinator.planning as planning
import triforce.coordinator.speed_model as speed_model
from triforce.coordinator.planning import AutoPlanner
from triforce.coordinator.speed_model import Acceptance, seconds_per_token
from triforce.coordinator.costs import CostTable

from given_costs import FLAT, FixedBatch, draft_rate, planner_with


def test_plain_decoding_where_speculation_cannot_pay():
    # A draft as dear as the target, and checks that cost a token each: nothing beats plain decoding.
    same = {"draft": {1: 1.0}, "retrieval": {n: 1.0 + 0.5 * n for n in FLAT}, "target": {n: 1.0 * n for n in FLAT}}
    assert planner_with(same).plan(1000, 0).mode == "ar"


def test_speculation_runs_only_where_its_expected_speed_beats_plain_decoding():
    """Optimism picks among the plans that pay at the mean acceptance; it never takes a request off plain
    decoding onto a plan that the mean says is slower (Qwen2.5-Coder at 32K: every mode within 10% of
    `ar`, where the optimistic bonus of faded evidence is as large as the differences)."""
    costs = {"draft": {1: 0.6}, "target": {n: 1.0 + 0.02 * (n - 1) for n in FLAT}}  # ar: 1 token/s

    def draft_rates(acceptance):  # draft mode's best tokens/s over gammas, at the mean and optimistic alpha
        return [max(1 / seconds_per_token(("draft", "target"), (g,), costs, {"draft": alpha})
                    for g in range(1, planning.MAX_GAMMA + 1)) for alpha in (acceptance.mean, acceptance.optimistic)]

    seen_little = Acceptance(0.5, successes=2.0, trials=4.0)
    mean_rate, optimistic_rate = draft_rates(seen_little)
    assert mean_rate < 1.0 < optimistic_rate  # the case this test is about
    planner = planner_with(costs)
    planner.acceptance["draft"] = seen_little
    plain = planner.plan(1000, 0)
    why = planner.decisions[-1]["why"]
    assert plain.mode == "ar" and not why["probe"]
    assert why["expected_tokens_per_s"]["draft"] == pytest.approx(mean_rate, abs=0.01)
    assert "draft" not in why["predicted_tokens_per_s"]
    # what an idle draft could gain (auto.py watches it only where that exceeds what watching costs)
    assert plain.draft_upside == pytest.approx(optimistic_rate, rel=1e-3) and why["draft_upside"] > 1
    # where the mean pays, the draft runs (plain decoding measured as the model predicts it)
    planner.observe_rate(plain, 1.0, 8)
    paying = Acceptance(0.7, successes=2.8, trials=4.0)
    assert draft_rates(paying)[0] > 1.0
    planner.acceptance["draft"] = paying
    assert planner.plan(1000, 8).mode == "draft" and planner.plan(1000, 16).draft_upside == 0  # it runs


def test_plain_decoding_is_measured_before_a_plan_that_beats_it_by_little():
    """A request that has not run `ar` runs it for a stretch before a plan expected to beat it by less
    than AR_PROBE; then the plan runs, or `ar` stays if it ran well above what the model said (its factor
    pools the stretch's 8 tokens with a start worth START_TOKENS: realized.py)."""
    costs = {"draft": {1: 0.3}, "target": {n: 1.0 + 0.02 * (n - 1) for n in FLAT}}
    acceptance = Acceptance(0.6, successes=600.0, trials=1000.0)
    expected = max(1 / seconds_per_token(("draft", "target"), (g,), costs, {"draft": acceptance.mean})
                   for g in range(1, planning.MAX_GAMMA + 1))
    assert 1.0 < expected < planning.AR_PROBE  # the case this test is about (ar: 1 token/s)
    for ar_rate, then in ((1.0, "draft"), (3 * expected, "ar")):
        planner = planner_with(costs)
        planner.acceptance["draft"] = copy.deepcopy(acceptance)
        probe = planner.plan(1000, 0)
        assert probe.mode == "ar" and planner.decisions[-1]["why"]["probe"]
        planner.observe_rate(probe, ar_rate, 8)
        assert planner.plan(1000, 8).mode == then
        assert planner.plan(1000, 16).mode == then  # probed once
    # a probe whose stretch measured nothing (it ran beside a batchmate's prefill) is not run again: it came
    # back at every plan, and a busy server's request ran `ar` throughout
    planner = planner_with(costs)
    planner.acceptance["draft"] = copy.deepcopy(acceptance)
    assert planner.plan(1000, 0).mode == "ar"
    assert planner.plan(1000, 8).mode == "draft" and not planner.decisions[-1]["why"]["probe"]
    # far ahead of plain decoding, the plan runs from the start
    cheap = planner_with({**costs, "draft": {1: 0.02}})
    cheap.acceptance["draft"] = copy.deepcopy(acceptance)
    assert cheap.plan(1000, 0).mode == "draft" and not cheap.decisions[-1]["why"]["probe"]


def test_the_full_hierarchy_where_checks_are_cheap():
    cheap = {"draft": {1: 0.05}, "retrieval": {n: 0.3 for n in FLAT}, "target": FLAT}
    plan = planner_with(cheap).plan(1000, 0)
    assert plan.mode == "triforce" and all(g > 1 for g in plan.gammas)
    assert plan.tokens_per_s > 1.0  # faster than plain decoding's one token per second


def test_a_batchmates_prefill_favours_fewer_target_forwards():
    """While a batchmate prefills, every target forward carries one of its prompt chunks: a plan that plain
    decoding wins alone (checks dear, below twice the budget) turns to the retrieval tier, though the
    context is below twice its budget, checking many tokens per target forward; without a known chunk cost
    nothing changes."""
    costs = {"draft": {1: 0.9}, "retrieval": {n: 0.8 + 0.2 * n for n in FLAT},
             "target": {n: 1.0 + 0.3 * n for n in FLAT}}
    planner = planner_with(costs, budget=600)  # context 1000 < 2 x 600
    assert planner.plan(1000, 0).mode == "ar"
    assert planner.plan(1000, 0, busy=True).mode == "ar"  # what a chunk adds is not known yet
    planner.times.chunk_seconds = 20.0
    busy = planner.plan(1000, 0, busy=True)
    assert busy.stack[-2:] == ("retrieval", "target") and busy.gammas[-1] >= 6
    assert planner.decisions[-1]["why"]["batchmate_chunk_ms"] == 20000.0


def test_dear_sampling_favours_fewer_rows():
    """Checks cost rows of logits that plain decoding never computes: where processing a row costs as
    much as a forward, speculation that wins on forwards alone loses."""
    costs = {"draft": {1: 0.2}, "target": {n: 1.0 + 0.1 * n for n in FLAT}}
    planner = planner_with(costs)
    assert planner.plan(1000, 0).mode == "draft"
    planner.row_seconds = 1.0
    planner.decisions.clear()
    assert planner.plan(1000, 0).mode == "ar"


def test_no_retrieval_tier_below_twice_its_budget():
    cheap = {"draft": {1: 0.05}, "retrieval": {n: 0.3 for n in FLAT}, "target": FLAT}
    planner = planner_with(cheap, budget=600)
    assert planner.plan(1000, 0).mode == "draft"
    assert planner.plan(1200, 0).mode == "triforce"
    assert [d["mode"] for d in planner.decisions] == ["draft", "triforce"]  # each change recorded, and why
    assert set(planner.decisions[0]["why"]["predicted_tokens_per_s"]) == {"ar", "draft"}


def test_a_larger_budget_runs_where_its_checks_pay():
    """Mode auto holds a retrieval tier per candidate budget: each is scored once the context is twice its
    budget, on its own acceptance, so a dearer budget whose proposals the target accepts more wins
    where the configured one's are rejected; its mode is named with its budget."""
    costs = {"draft": {1: 0.05}, "retrieval": {n: 0.3 for n in FLAT}, "retrieval@200": {n: 0.4 for n in FLAT},
             "target": FLAT}
    planner = planner_with(costs, budget=100)
    assert planner.plan(300, 0).stack == ("draft", "retrieval", "target")  # 300 < 2 x 200; the prior alike
    assert planner.plan(1000, 0).stack == ("draft", "retrieval", "target")  # the cheaper of two alike
    planner.acceptance["retrieval"] = Acceptance(0.85, successes=10.0, trials=40.0)
    planner.acceptance["retrieval@200"] = Acceptance(0.85, successes=38.0, trials=40.0)
    plan = planner.plan(1000, 0)
    assert plan.stack == ("draft", "retrieval@200", "target") and plan.mode == "triforce@200"
    assert {"triforce", "triforce@200", "retrieval@200"} <= set(planner.decisions[-1]["why"]["predicted_tokens_per_s"])
    assert [d["mode"] for d in planner.decisions] == ["triforce", "triforce@200"]


def test_of_two_drafts_the_one_whose_accepted_tokens_cost_least_runs():
    """With auto_self_draft the planner holds two draft tiers: the draft model's, cheap, and the target's own
    weights over a streaming window ("draft@self"), dear but accepted far more. Each is scored on its own
    cost and acceptance, as its own mode ("draft@self"; above the retrieval tier "triforce@self"), and the
    self draft runs where the draft model's proposals are mostly rejected, the draft model where they are
    not; the idle one is watched only where its best stack is predicted to beat the plan."""
    costs = {"draft": {1: 0.05}, "draft@self": {1: 0.3}, "retrieval": {n: 0.6 for n in FLAT}, "target": FLAT}
    planner = planner_with(costs, budget=100)
    planner.acceptance["draft"] = Acceptance(0.6, successes=30.0, trials=100.0)
    planner.acceptance["draft@self"] = Acceptance(0.6, successes=90.0, trials=100.0)
    plan = planner.plan(1000, 0)
    assert plan.mode == "draft@self"
    assert 0 < plan.draft_upside < 1 and plan.watch == ()  # the idle draft model's tier: scored, not watched
    predicted = planner.decisions[-1]["why"]["predicted_tokens_per_s"]
    assert {"draft", "draft@self", "triforce", "triforce@self"} <= set(predicted)
    assert predicted["draft@self"] > predicted["draft"]
    planner.acceptance["draft"] = Acceptance(0.6, successes=50.0, trials=100.0)
    plan = planner.plan(1000, 8)  # the idle one might gain now: watched, not yet run
    assert plan.mode == "draft@self" and plan.draft_upside > 1 and plan.watch == ("draft",)
    planner.acceptance["draft"] = Acceptance(0.6, successes=85.0, trials=100.0)
    plan = planner.plan(1000, 16)
    assert plan.mode == "draft" and plan.watch == ()
    assert [d["mode"] for d in planner.decisions] == ["draft@self", "draft"]


def test_a_budget_far_below_a_quarter_of_the_context_starts_from_a_lower_prior():
    """Where no earlier request ran, a retrieval tier starts from PRIOR_STEP less per halving of its
    budget below a quarter of the context: at 1,600 tokens the tier of 400 is tried before the cheaper
    one of 100, which the same prior for all would pick."""
    assert speed_model.prior("retrieval@8192", 8192, 32000) == speed_model.PRIOR["retrieval"]
    assert speed_model.prior("retrieval", 2048, 32768) == pytest.approx(speed_model.PRIOR["retrieval"]
                                                                        - 2 * speed_model.PRIOR_STEP)
    assert speed_model.prior("draft", 2048, 32768) == speed_model.PRIOR["draft"]
    costs = {"draft": {1: 0.05}, "retrieval": {n: 0.3 for n in FLAT}, "retrieval@400": {n: 0.35 for n in FLAT},
             "target": FLAT}
    same = planner_with(costs, budget=100)
    assert same.plan(1600, 0).stack == ("draft", "retrieval", "target")
    planner = planner_with(costs, budget=100)
    planner.recall("a kind no request ran", 1600)
    assert planner.acceptance["retrieval"].mean == pytest.approx(0.85 - 2 * speed_model.PRIOR_STEP)
    assert planner.plan(1600, 0).stack == ("draft", "retrieval@400", "target")


@pytest.mark.parametrize("growth,expected", [(0.02, 0.0), (0.5, planning.STOP_BELOW)])
def test_chains_end_early_where_checks_grow_steeply(growth, expected):
    """With tiles a check of 4 tokens costs about one token's (growth 0.02 a token): chains run to gamma.
    Where each token adds half a token's cost (vector arithmetic), the draft ends a chain after an unsure
    proposal. The plan carries the choice and its record says it; a stop_below the user set wins."""
    costs = {"draft": {1: 0.05}, "target": {n: 1.0 + growth * (n - 1) for n in FLAT}}
    planner = planner_with(costs)
    for name in ("draft", *speed_model.stop_names("draft")):  # (the chains that stop: their own rates)
        planner.acceptance[name] = Acceptance(0.9, successes=9e3, trials=1e4)
    plan = planner.plan(1000, 0)
    assert plan.mode == "draft" and plan.stop_below == expected
    assert planner.decisions[-1]["stop_below"] == expected
    planner.fixed_stop = 0.2
    assert planner.plan(1000, 8).stop_below == 0.2 and planner.decisions[-1]["stop_below"] == 0.2


def test_a_retrieval_tiers_chains_run_to_gamma_on_steep_checks(monkeypatch):
    """The stop is the draft's: the retrieval tier samples nearly the target's rows, so its unsure tokens
    are accepted about as often as its sure ones, and ending its chains there only shortens the checks.
    On checks steep enough to stop the draft, `retrieval` mode runs and is priced with chains of gamma."""
    monkeypatch.setattr(planning, "AR_PROBE", 0.0)
    steep = {n: 1.0 + 0.5 * (n - 1) for n in FLAT}
    costs = {"draft": {1: 0.6}, "retrieval": {n: 0.1 for n in FLAT}, "target": steep}
    planner = planner_with(costs)
    for name in ("retrieval", *speed_model.stop_names("retrieval")):
        planner.acceptance[name] = Acceptance(0.9, successes=9e3, trials=1e4)
    plan = planner.plan(1000, 0)
    assert plan.mode == "retrieval" and plan.stop_below == 0.0
    assert planner._stop_below(("draft", "target")) == planning.STOP_BELOW  # the draft's chains stop there
    chains = 1 / seconds_per_token(plan.stack, plan.gammas, costs, {"retrieval": 0.9}, 0.0, False)
    assert planner.decisions[-1]["why"]["predicted_tokens_per_s"]["retrieval"] == pytest.approx(chains, rel=0.02)
    planner.fixed_stop = 0.2  # a stop the user set applies to whichever tier proposes
    assert planner.plan(1000, 8).stop_below == 0.2


def test_the_mean_picks_a_modes_gammas_and_optimism_its_score(monkeypatch):
    """Optimism (mean + one standard deviation) is for trying tiers seen little; it lifts deep proposals
    most (alpha^k), so a mode's gammas are the best at the mean acceptance, and the mode is scored at them
    with the optimistic one."""
    monkeypatch.setattr(planning, "AR_PROBE", 0.0)
    costs = {"draft": {1: 0.1}, "target": dict(FLAT)}
    planner = planner_with(costs)  # the generic prior: 0.6 worth 4 trials
    draft = planner.acceptance["draft"]
    mean, optimistic = draft.mean, draft.optimistic  # no evidence yet: fading leaves them

    def best(alpha):
        return max(range(1, planning.MAX_GAMMA + 1), key=lambda g: draft_rate(costs, g, alpha))
    assert best(optimistic) > best(mean)
    plan = planner.plan(1000, 0)
    assert plan.mode == "draft" and plan.gammas == (best(mean),)
    assert plan.tokens_per_s == pytest.approx(draft_rate(costs, plan.gammas[0], optimistic))


def test_a_mode_runs_the_users_gammas_unless_others_promise_much_more(monkeypatch):
    """The model's speed is flat in gamma near its best, and real speed is not smooth there (a greedy text's
    rounds begin at other positions), so auto runs gamma1 / gamma2 unless other gammas promise
    GAMMA_MARGIN more; a poor draft still gets short chains, and the user's gammas are the preferred ones."""
    monkeypatch.setattr(planning, "AR_PROBE", 0.0)
    costs = {"draft": {1: 0.05}, "target": dict(FLAT)}
    planner = planner_with(costs)
    planner.acceptance["draft"] = Acceptance(0.8, successes=8e3, trials=1e4)
    rate = {g: draft_rate(costs, g, planner.acceptance["draft"].mean) for g in range(1, planning.MAX_GAMMA + 1)}
    assert max(rate, key=rate.get) == 8 and rate[8] < planning.GAMMA_MARGIN * rate[4]  # the model alone: 8
    assert planner.plan(1000, 0).gammas == (8,)
    planner = planner_with(costs)
    planner.preferred_gammas = (4, 6)
    planner.acceptance["draft"] = Acceptance(0.8, successes=8e3, trials=1e4)
    assert planner.plan(1000, 0).gammas == (4,)
    planner.preferred_gammas = (5, 6)  # --gamma1 5
    assert planner.plan(1000, 8).gammas == (5,)
    planner.acceptance["draft"] = Acceptance(0.15, successes=1.5e3, trials=1e4)  # a poor draft: 1 pays much more
    rate = {g: draft_rate(costs, g, planner.acceptance["draft"].mean) for g in (1, 5)}
    assert rate[1] > planning.GAMMA_MARGIN * rate[5]
    plan = planner.plan(1000, 16)
    assert plan.mode == "draft" and plan.gammas == (1,)


@pytest.mark.parametrize("growth,shortest", [(0.02, 1), (0.3, planning.STOP_MIN_GAMMA)])
def test_with_the_stop_on_gamma_is_a_cap_of_at_least_two(growth, shortest, monkeypatch):
    """At a poor acceptance (a bad start) the model's best gamma is 1. With the stop on (steep checks) it
    is not: the stop ends chains where the draft is unsure, and a gamma of 1 would also cut its confident
    stretches short. Without the stop (flat checks) a gamma of 1 stays possible."""
    monkeypatch.setattr(planning, "AR_PROBE", 0.0)  # the draft beats `ar` by little: no probe of `ar` first
    costs = {"draft": {1: 0.05}, "target": {n: 1.0 + growth * (n - 1) for n in FLAT}}
    planner = planner_with(costs)
    planner.acceptance["draft"] = Acceptance(0.5, successes=5e3, trials=1e4)
    unconstrained = max(range(1, planning.MAX_GAMMA + 1),
                        key=lambda g: draft_rate(costs, g, planner.acceptance["draft"].mean))
    plan = planner.plan(1000, 0)
    assert plan.mode == "draft"
    assert plan.gammas == (max(unconstrained, shortest),) and (growth < 0.1 or unconstrained == 1)


def test_the_running_mode_stays_unless_another_is_clearly_faster(monkeypatch):
    """A switch costs a catch-up and chases noise when the two are close: ar must promise SWITCH_MARGIN
    more than the running draft mode to replace it."""
    monkeypatch.setattr(planning, "AR_PROBE", 0.0)  # `ar` taken as measured: no probe of it first
    target = {n: 1.0 + 0.05 * (n - 1) for n in FLAT}

    def ar_over_draft(d):  # with the draft's acceptance known exactly (0.3)
        draft = max(1 / seconds_per_token(("draft", "target"), (g,), {"draft": {1: d}, "target": target},
                                          {"draft": 0.3}) for g in range(1, planning.MAX_GAMMA + 1))
        return 1.0 / draft

    close = next(d / 1000 for d in range(1, 500) if 1.0 < ar_over_draft(d / 1000) < planning.SWITCH_MARGIN)
    clear = next(d / 1000 for d in range(1, 500) if ar_over_draft(d / 1000) > 1.1)
    for d, expected in ((close, "draft"), (clear, "ar")):
        planner = planner_with({"draft": {1: d}, "target": target})
        planner.acceptance["draft"] = Acceptance(0.3, successes=0.3e6, trials=1e6)
        planner.decisions.append({"mode": "draft", "gammas": [1]})  # draft mode is running
        assert planner.plan(1000, 8).mode == expected, d


def test_a_batch_plans_per_token_of_the_whole_batch():
    """A forward of B sequences reads the weights once and each sequence's cache: alone the draft's cheap
    weights pay most (draft mode), at batch 8 the full caches the target reads cost most and the retrieval
    tier's small one pays (triforce). (The costs are picked so: with the target's checks taking every token
    of tier 2's rounds, a cheaper shared weight read, 1.0 where this is 1.4, makes triforce win alone too.)"""
    def call_costs(b):  # seconds of one call of b sequences: weights once, each one's cache and rows
        return {"draft": {1: 0.15 + b * 0.01}, "retrieval": {n: 1.4 + b * (0.05 + 0.02 * n) for n in FLAT},
                "target": {n: 1.4 + b * (1.0 + 0.02 * n) for n in FLAT}}

    planner = AutoPlanner({n: None for n in ("draft", "retrieval", "target")}, 100, table=CostTable(None),
                          batchmates=FixedBatch(1))

    def costs(stacks, measure=True):
        planner._batch = planner.batchmates.size(planner)
        return call_costs(planner._batch)

    planner.costs = costs
    assert planner.plan(1000, 0).mode == "draft"
    planner.batchmates = FixedBatch(11)  # planned as 8: costs are measured at powers of two
    plan = planner.plan(1000, 8)
    assert plan.mode == "triforce" and planner.decisions[-1]["why"]["batch"] == 8
    # predicted per token of the batch
    alphas = {n: a.optimistic for n, a in planner.acceptance.items()}
    per_sequence = {n: {k: c / 8 for k, c in by_n.items()} for n, by_n in call_costs(8).items()}
    assert plan.tokens_per_s == pytest.approx(1 / seconds_per_token(plan.stack, plan.gammas, per_sequence, alphas))
    # a sequence that reaches 1/8 of it reached what the model predicts for the batch
    planner.acceptance = {n: Acceptance(a) for n, a in alphas.items()}
    planner.observe_rate(plan, plan.tokens_per_s / 8, 8)
    assert planner.realized["triforce"] == pytest.approx(1.0)


def test_a_mode_is_planned_with_its_own_overhead_and_a_retrieval_tier_at_the_targets_scale():
    """The time after a target check holds the retrieval tier's syncs and rebuilds in `triforce`, none in
    `draft`: each mode that ran is planned with its own (`draft` was charged triforce's), one that has not
    with any mode's. A retrieval tier that has not run is priced at the target's scale, not the table's
    (the same weights: where the target ran at 1.5x the table, retrieval modes looked cheaper than they were)."""
    from triforce.coordinator.forward_times import ForwardTimes

    times = ForwardTimes(CostTable(None))
    stacks = [("target",), ("draft", "target"), ("draft", "retrieval", "target"), ("retrieval", "target")]
    times.plan_with({"draft": {1: 0.1}, "retrieval": {1: 0.2}, "target": {1: 1.0}}, 1, stacks)
    for _ in range(60):
        times.observe_overhead("triforce", "target", "check", 0.5, 1, 0.0)
        times.observe_overhead("draft", "target", "check", 0.1, 1, 0.0)
        times.observe_cost("draft", "target", 1, 1.5)
    assert times.per_sequence(("draft", "target"), now=True)["target"][1] == pytest.approx(1.5 + 0.1)
    assert times.per_sequence(("draft", "retrieval", "target"), now=True)["target"][1] == pytest.approx(1.5 + 0.5)
    untried = times.per_sequence(("retrieval", "target"), now=True)["target"][1] - 1.5
    assert 0.1 < untried < 0.5  # any mode's lately
    assert times.per_sequence(("retrieval", "target"), now=True)["retrieval"][1] == pytest.approx(0.2 * 1.5)
    times.observe_cost("triforce", "retrieval", 1, 0.6)  # a slow forward of its own: 3x the table
    assert times.per_sequence(("retrieval", "target"), now=True)["retrieval"][1] > 0.2 * 1.7
    for _ in range(30):
        times.fade("draft", 0.5)  # idle, it fades back to the target's scale (it faded to the table's)
    assert times.per_sequence(("retrieval", "target"), now=True)["retrieval"][1] == pytest.approx(0.2 * 1.5)


def test_in_a_batch_each_sequence_pays_its_own_overhead_and_a_share_of_a_call():
    """The time between a request's forwards (sampling, verification, bookkeeping) is each sequence's own: a
    batch of 8 pays it 8 times per call. Charged per call (1/8 per sequence), `triforce` at batch 8, 8K and
    0.6 on the AMX Xeon was priced 0.38 s of it where 2.67 s passed, and mode auto ran it where `draft` was
    faster (forward_times.py). A batchmate's prompt chunk is one per target call, shared."""
    from triforce.coordinator.forward_times import ForwardTimes

    times = ForwardTimes(CostTable(None))
    times.plan_with({"draft": {1: 0.08}, "target": {1: 1.6}}, 8, [("target",), ("draft", "target")])
    times.observe_overhead("draft", "target", "check", 0.5, 1, 0.0)
    times.observe_overhead("draft", "draft", "bottom", 0.02, 1, 0.0)
    per_sequence = times.per_sequence(("draft", "target"), chunk=0.8)
    assert per_sequence["target"][1] == pytest.approx(1.6 / 8 + 0.5 + 0.8 / 8)
    assert per_sequence["draft"][1] == pytest.approx(0.08 / 8 + 0.02)


def test_overhead_per_draft_step_shortens_the_chains():
    """A draft step's overhead (sampling, lookup, bookkeeping past the row cost) is paid gamma times per
    check: planned for, it shortens the chains a forward's cost alone would choose."""
    costs = {"draft": {1: 0.05}, "target": dict(FLAT)}
    planner = planner_with(costs)
    planner.acceptance["draft"] = Acceptance(0.8, successes=8e3, trials=1e4)
    planner.row_seconds = 0.01
    long = planner.plan(1000, 0).gammas[0]
    for _ in range(50):
        planner.times.observe_overhead("draft", "draft", "bottom", 0.16, 1, planner.row_seconds)  # 0.15 past 0.01
    assert planner.times.overhead["draft/bottom"] == pytest.approx(0.15)
    short = planner.plan(1000, 8).gammas[0]
    alpha = planner.acceptance["draft"].mean  # a mode's gammas are picked at the mean
    costs["draft"] = {1: 0.2}
    assert short < long and short == max(range(1, planning.MAX_GAMMA + 1),
                                         key=lambda g: draft_rate(costs, g, alpha, 0.01))
