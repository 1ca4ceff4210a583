"""What `--mode auto`'s planner (planning.py; planner_evidence.py) learns as a request runs, on given costs:
acceptance from checks (and an idle draft's), forward costs and overheads from its forwards, each mode's speed against
its model, alone and in a batch; what it forgets as it goes."""
import copy
from types import SimpleNamespace

import pytest
import torch

import triforce.coordinator.forward_times as forward_times
import triforce.coordinator.planner_evidence as evidence
import triforce.coordinator.planning as planning
import triforce.coordinator.realized as realized
from triforce.coordinator.batchmates import Batchmates
from triforce.coordinator.planning import AutoPlanner
from triforce.coordinator.priors import LEARNED_TRIALS
from triforce.coordinator.realized import RealizedSpeed
from triforce.coordinator.speed_model import Acceptance, Plan, seconds_per_token
from triforce.coordinator.costs import CostTable, interpolate

from given_costs import FLAT, FixedBatch, planner_with


def test_a_draft_that_is_rejected_is_dropped():
    costs = {"draft": {1: 0.2}, "target": {n: 1.0 + 0.1 * n for n in FLAT}}
    planner = planner_with(costs)
    assert planner.plan(1000, 0).mode == "draft"  # the prior: a draft accepted 60% of the time pays
    for _ in range(20):
        planner.observe("draft", 4, 0)
    assert planner.plan(1000, 80).mode == "ar"
    kept = evidence.EVIDENCE_KEPT ** (80 / evidence.EVIDENCE_TOKENS)
    assert planner.decisions[-1]["why"]["acceptance"]["draft"] == pytest.approx(
        (0.6 * 4) / (20 * kept + 4), abs=1e-3)  # the 20 rejections, 80 tokens behind at this plan
    # idle, its evidence fades: after a while it is tried again (a bad start is not the last word)
    modes = [planner.plan(1000, 80 + 8 * i).mode for i in range(1, 40)]
    assert "draft" in modes


def test_an_idle_drafts_evidence_brings_it_back_at_the_next_plan():
    """A draft dropped after a bad start: what it would have proposed while idle (auto.py's evidence) puts it
    back at the next plan, instead of after its old evidence has faded."""
    costs = {"draft": {1: 0.2}, "target": {n: 1.0 + 0.1 * n for n in FLAT}}
    planner = planner_with(costs)
    for _ in range(20):
        planner.observe("draft", 4, 0)
    plain = planner.plan(1000, 8)
    assert plain.mode == "ar"
    planner.observe_rate(plain, plain.tokens_per_s, 8)  # its stretch ran as predicted
    without = copy.deepcopy(planner)
    planner.observe_idle("draft", 7.5, 8.0)  # 8 tokens of `ar`, where it would have done well
    assert planner.plan(1000, 16).mode == "draft"
    assert without.plan(1000, 16).mode == "ar"  # what the old evidence alone said


def test_evidence_fades_by_the_tokens_committed_not_by_the_plans_made():
    """Rejections seen 64 tokens ago count as much whether one plan came since or eight (a mode of long
    rounds re-plans seldom): before, they faded once per plan, so a draft rejected early stayed rated poor
    through a slow mode's long stretches after its proposals had all been accepted."""
    costs = {"draft": {1: 0.2}, "target": {n: 1.0 + 0.1 * n for n in FLAT}}
    seldom, often = planner_with(costs), planner_with(costs)
    for planner in (seldom, often):
        planner.plan(1000, 0)
        for _ in range(20):
            planner.observe("draft", 4, 0)
    seldom.plan(1000, 64)
    for generated in range(8, 72, 8):
        often.plan(1000, generated)
    faded = evidence.EVIDENCE_KEPT ** (64 / evidence.EVIDENCE_TOKENS)
    for planner in (seldom, often):
        assert planner.acceptance["draft"].trials == pytest.approx(20 * faded)


def test_costs_follow_what_forwards_really_take():
    costs = {"draft": {1: 0.2}, "target": {n: 1.0 + 0.1 * n for n in FLAT}}
    planner = planner_with(costs)
    assert planner.plan(1000, 0).mode == "draft"
    for _ in range(20):
        planner.times.observe_cost(planner.running, "draft", 1, 1.0)  # five times what the table says (a busier machine)
    assert planner.plan(1000, 80).mode == "ar"
    assert planner.decisions[-1]["why"]["cost_scale"]["draft"] > 4


def test_each_mode_is_planned_at_what_its_own_forwards_took(monkeypatch):
    """A target interleaved with a draft ran slower than the table (which times forwards back to back, as
    `ar` steps): that slows the prediction of the mode it ran in, and of `ar` only until `ar` has run and
    shown its own (Qwen2.5-Coder-1.5B at 32K: 10% slower in `triforce` mode, so `ar` looked slower than
    it was and auto never ran it)."""
    monkeypatch.setattr(planning, "AR_PROBE", 0.0)
    costs = {"draft": {1: 0.1}, "target": {n: 1.0 + 0.02 * (n - 1) for n in FLAT}}
    planner = planner_with(costs)
    assert planner.plan(1000, 0).mode == "draft"
    for _ in range(30):
        planner.times.observe_cost(planner.running, "target", 4, 1.5 * interpolate(costs["target"], 4))
    planner.plan(1000, 8)
    assert planner.times.state()["mode_cost_scale"]["draft"]["target"] == pytest.approx(1.5, rel=1e-2)
    assert planner.times.scaled["ar"]["target"][1] == pytest.approx(1.5, rel=1e-2)  # not run: the tier's lately
    planner.decisions.append({"mode": "ar", "gammas": []})  # `ar` runs: its steps take the table's time
    for _ in range(30):
        planner.times.observe_cost(planner.running, "target", 1, costs["target"][1])
    planner.decisions.append({"mode": "draft", "gammas": [4]})  # and the draft again, as slow as before
    for _ in range(30):
        planner.times.observe_cost(planner.running, "target", 4, 1.5 * interpolate(costs["target"], 4))
    planner.plan(1000, 16)  # `ar` idle since: its scale fades once towards the tier's
    kept = evidence.EVIDENCE_KEPT
    assert planner.times.scaled["ar"]["target"][1] == pytest.approx(1.5 + (1.0 - 1.5) * kept, rel=1e-2)
    assert planner.times.scaled["draft"]["target"][4] == pytest.approx(1.5 * interpolate(costs["target"], 4), rel=1e-2)
    assert planner.times.scale["target"] == pytest.approx(1.5, rel=1e-2)  # the tier's, for the table's re-measurement


def test_costs_a_request_found_far_off_are_measured_again_by_the_next(tmp_path):
    """A cost table measured in a slow spell (the target at 8x its cost) steered every later request (seen at
    4K on a shared machine): a request whose forwards took far from the table's costs has the entry it
    planned with measured again by the next request; a tier near the table's is left, and an entry another
    request has measured since is kept. (Scaling the entry by what the request saw, as before, once made a
    slow spell of one request the draft's cost for good: priced 10x, it never ran to show otherwise.)"""
    from types import SimpleNamespace

    from triforce.models.config import ModelConfig

    costs = {"draft": {1: 0.2}, "target": {n: 1.0 + 0.1 * n for n in FLAT}}
    planner = planner_with(costs)
    planner.plan(1000, 0)
    calls = []
    planner.times.table = SimpleNamespace(forget=lambda *args: calls.append(args))
    for _ in range(forward_times.REMEASURE_FORWARDS):
        planner.times.observe_cost(planner.running, "target", 1, 0.125 * interpolate(costs["target"], 1))  # 1/8 the table
        planner.times.observe_cost(planner.running, "draft", 1, 0.21)  # about the table's
    planner.remember()
    assert calls == [("target", costs["target"])]  # the entry it planned with

    table = CostTable(tmp_path / "costs.json")
    config = ModelConfig(model_type="llama", vocab_size=8, hidden_size=16, intermediate_size=8, num_layers=2,
                         num_heads=2, num_kv_heads=1, head_dim=8, max_position_embeddings=64)
    model = SimpleNamespace(config=config, dtype=torch.float32, device=torch.device("cpu"))
    tier = SimpleNamespace(name="target", model=model, placement="local", cache=None, length=1000)
    table.entries[table.entry_key(tier)] = {"1": 0.8, "4": 1.6}
    key = table.entry_key(tier)
    table.forget(key, {1: 0.7})  # planned with another entry: measured again since
    assert CostTable(tmp_path / "costs.json").entries == {} and table.entries[key] == {"1": 0.8, "4": 1.6}
    tier.length = 1200  # the request's context moved on, past the entry's tolerance: the entry it read goes
    assert table.entry_key(tier) != key
    table.forget(key, {1: 0.8})
    assert key not in table.entries and not table.known(tier, (1,))
    assert CostTable(tmp_path / "costs.json").entries == {}  # gone on disk too
    # an entry another process measured anew since this one read it stays on disk (it was deleted by the
    # forget of a process that planned with the old one, and measured yet again)
    table.entries[key] = {"1": 0.8}
    table.save(key)
    other = CostTable(tmp_path / "costs.json")
    other.entries[key] = {"1": 0.5}
    other.save(key)
    table.forget(key, {1: 0.8})
    assert CostTable(tmp_path / "costs.json").entries == {key: {"1": 0.5}} == {key: table.entries[key]}
    # and where another added a size only, the sizes this one found far off go, that one stays
    table.entries[key] = {"1": 0.8, "4": 1.6}
    table.save(key)
    other = CostTable(tmp_path / "costs.json")
    other.entries[key]["8"] = 2.4
    other.save(key)
    table.forget(key, {1: 0.8})
    assert CostTable(tmp_path / "costs.json").entries == {key: {"8": 2.4}}


def test_a_batch_near_its_end_plans_with_a_batch_size_the_table_knows(tmp_path):
    """A batch shrinks as its members end; measuring the new size's costs takes seconds (the Qwen pair at
    8K, batch 4 down to 2: 5 s of a 28 s decode, benchmarks/batch_timeline.py), so with few tokens left
    (`measure` off) the nearest batch size the table knows stands in; with many left it is measured."""
    from types import SimpleNamespace

    from triforce.models.config import ModelConfig

    config = ModelConfig(model_type="llama", vocab_size=8, hidden_size=16, intermediate_size=8, num_layers=2,
                         num_heads=2, num_kv_heads=1, head_dim=8, max_position_embeddings=64)
    model = SimpleNamespace(config=config, dtype=torch.float32, device=torch.device("cpu"))
    tiers = {name: SimpleNamespace(name=name, model=model, placement="local", cache=None, length=1000)
             for name in ("draft", "target")}
    table = CostTable(tmp_path / "costs.json")
    table.entries[table.entry_key(tiers["draft"], 4)] = {"1": 0.1}
    table.entries[table.entry_key(tiers["target"], 4)] = {str(n): 1.0 for n in planning.CHECK_SIZES}
    measured, seconds = [], table.seconds

    def measuring(group, sizes, prepare, batch):
        if table.known(group[0], sizes, batch):
            return seconds(group, sizes, prepare, batch)
        measured.append((group[0].name, batch))
        return {n: 1.0 for n in sizes}

    table.seconds = measuring
    planner = AutoPlanner(tiers, None, table=table, batchmates=FixedBatch(2))
    plan = planner.plan(1000, 100, measure=False)
    assert measured == [] and planner.decisions[-1]["why"]["batch"] == 4
    # two sequences' forwards and speed against four's costs: no evidence of either
    planner.times.observe_cost(plan.mode, "target", 1, 0.5)
    planner.observe_rate(plan, 100.0, 8)
    assert planner.times.scale == {} and planner.realized == {}
    plan = planner.plan(1000, 100)  # no batchmate to measure with: measured alone
    assert measured == [("draft", 1), ("target", 1)]
    planner.times.observe_cost(plan.mode, "target", 1, 0.5)
    planner.observe_rate(plan, 100.0, 8)
    assert planner.times.scale["target"] < 1 and plan.mode in planner.realized
    # forwards of two sequences far above one's cost: the lone entry is not wrong for that, and stays
    table.entries[table.entry_key(tiers["target"])] = {str(n): 1.0 for n in planning.CHECK_SIZES}
    planner.plan(1000, 108)
    for _ in range(forward_times.REMEASURE_FORWARDS):
        planner.times.observe_cost(planner.running, "target", 1, 3.0)
    planner.remember()
    assert planner.times.scale["target"] > forward_times.REMEASURE_BEYOND
    assert table.known(tiers["target"], planning.CHECK_SIZES)


def test_an_idle_tiers_cost_scale_fades_back_to_the_table(monkeypatch):
    """A slow spell while the draft ran (its forwards 10x the table's) drops it; idle, its cost scale fades
    back towards the table's at each plan, as an idle proposer's acceptance fades to its prior, so the
    draft is tried again instead of priced out for the rest of the request."""
    monkeypatch.setattr(planning, "AR_PROBE", 0.0)
    costs = {"draft": {1: 0.1}, "target": {n: 1.0 + 0.02 * (n - 1) for n in FLAT}}
    planner = planner_with(costs)
    planner.acceptance["draft"] = Acceptance(0.7, successes=70.0, trials=100.0)
    assert planner.plan(1000, 0).mode == "draft"
    for _ in range(30):
        planner.times.observe_cost(planner.running, "draft", 1, 1.0)
    modes = [planner.plan(1000, 8 * i).mode for i in range(1, 30)]
    assert modes[0] == "ar" and "draft" in modes[1:20]
    assert planner.decisions[-1]["mode"] == "draft" and planner.decisions[-1]["why"]["cost_scale"]["draft"] < 5


def test_a_stretch_of_slow_forwards_scales_the_costs_not_the_modes_speed_factor(monkeypatch):
    """A stretch whose target forwards took 1.5x the table, at the speed the model predicts for forwards
    that slow: the slowness is the forwards' (the mode's cost scale), and nothing is left over for its
    realized factor. Measured against the costs the plan was made with, the factor took it too (0.67),
    and the next plan counted the slowness twice."""
    monkeypatch.setattr(planning, "AR_PROBE", 0.0)
    costs = {"draft": {1: 0.1}, "target": {n: 1.0 + 0.02 * (n - 1) for n in FLAT}}
    planner = planner_with(costs)
    plan = planner.plan(1000, 0)
    assert plan.mode == "draft"
    checked = plan.gammas[0] + 1
    for _ in range(30):
        planner.times.observe_cost(planner.running, "target", checked, 1.5 * interpolate(costs["target"], checked))
    slow = {"draft": costs["draft"], "target": {n: 1.5 * c for n, c in costs["target"].items()}}
    alphas = {n: a.mean for n, a in planner.acceptance.items()}
    planner.observe_rate(plan, 1 / seconds_per_token(plan.stack, plan.gammas, slow, alphas, planner.row_seconds), 40)
    assert planner.realized["draft"] == pytest.approx(1.0, rel=1e-2)


def pooled(made: float, modelled: float, start: float = 1.0) -> float:
    """A mode's factor from `made` tokens in the time its model gives `modelled`, from `start` (realized.py)."""
    return (realized.START_TOKENS + made) / (realized.START_TOKENS / start + modelled)


def test_a_mode_slower_than_its_model_is_dropped():
    """Sampling and verification between forwards are outside the cost model: a mode that runs at half
    the speed its forwards predict is scored at what it reached, pooled over its stretches (realized.py)."""
    costs = {"draft": {1: 0.2}, "target": {n: 1.0 + 0.1 * n for n in FLAT}}
    planner = planner_with(costs)
    plan = planner.plan(1000, 0)
    assert plan.mode == "draft"
    planner.observe_rate(plan, 0.5 / seconds_per_token(plan.stack, plan.gammas, costs,
                                                       {n: a.mean for n, a in planner.acceptance.items()}), 80)
    assert planner.realized["draft"] == pytest.approx(pooled(80, 160))
    assert planner.plan(1000, 80).mode == "ar"  # which verifies nothing: its model is whole
    planner.observe_rate(Plan(("target",), (), 0.0), 0.4 / costs["target"][1], 80)  # ar ran slower still
    assert planner.plan(1000, 160).mode == "draft"
    # the draft's evidence kept RUNNING_KEPT at the plan that dropped it, then idle faded towards its start
    # as acceptance evidence does, by the 80 tokens committed since
    kept = realized.RUNNING_KEPT * evidence.EVIDENCE_KEPT ** (80 / evidence.EVIDENCE_TOKENS)
    faded = pooled(80 * kept, 160 * kept)
    assert faded > pooled(80, 160) and planner.realized["draft"] == pytest.approx(faded)
    # an untried speculative mode is guessed at the speculative modes' mean, not at ar's
    assert planner._realized("retrieval") == pytest.approx(faded)
    planner.plan(1000, 240)  # draft mode runs: ar's factor fades, the draft's keeps RUNNING_KEPT of its evidence
    kept *= realized.RUNNING_KEPT
    assert 0.4 < planner.realized["ar"] < 1
    assert planner.realized["draft"] == pytest.approx(pooled(80 * kept, 160 * kept))


def in_a_batch(planner: AutoPlanner) -> AutoPlanner:
    """`planner` planning for a batch of two (a batchmate whose prompt is prefilled)."""
    planner.batchmates = Batchmates()
    for member in (planner, AutoPlanner({}, None)):
        planner.batchmates.join(SimpleNamespace(planner=member, plans=True))
    return planner


def test_a_batch_pools_each_members_prior_with_its_checks():
    """Eight alike members (each a poor opening: 2 of 9 tokens accepted) pool to what each holds alone, and
    their idle draft drifts back to its prior as fast as one request's does; with one prior for the batch
    the pooled checks outweighed it eightfold. With no checks yet, the batch's optimism is that of eight
    priors' weight: a remembered 0.94 worth 12 trials is scored at 0.99 alone, not in a batch of 8."""
    members = [AutoPlanner({}, None) for _ in range(8)]
    mates = Batchmates()
    for member in members:
        member.batchmates = mates
        mates.join(SimpleNamespace(planner=member, plans=True))
    alone = AutoPlanner({}, None)
    for planner in members + [alone]:
        planner.acceptance["retrieval"] = Acceptance(0.94, LEARNED_TRIALS)
    fresh = members[0].estimates()["retrieval"]
    assert alone.estimates()["retrieval"].optimistic == pytest.approx(0.99)
    assert fresh.mean == pytest.approx(0.94) and fresh.optimistic < 0.97
    assert fresh.optimistic == pytest.approx(0.94 + (0.94 * 0.06 / (8 * LEARNED_TRIALS)) ** 0.5)
    for planner in members + [alone]:
        planner.observe("draft", 9, 2)  # 2 accepted, a rejection: 3 trials
    kept = evidence.EVIDENCE_KEPT ** (40 / evidence.EVIDENCE_TOKENS)
    for planner in members + [alone]:
        planner.fade(40)
    pooled_draft, own = members[0].estimates()["draft"], alone.estimates()["draft"]
    assert pooled_draft.mean == pytest.approx(own.mean)
    assert own.mean == pytest.approx((2 * kept + 4 * 0.6) / (3 * kept + 4))


@pytest.mark.parametrize("together,ar_factor", [(True, 0.8), (True, 1.3), (False, 0.8)])
def test_an_untried_mode_in_a_batch_is_not_favoured_by_what_slowed_plain_decoding(together, ar_factor):
    """In a batch, plain decoding ran at 0.8 of its model (as at batch 2 on the AVX2 EPYC, where the overhead
    between forwards was unmeasured then) and no speculative mode has run: an untried one is guessed at ar's
    factor, since its rounds pay the same between forwards, so a draft the model scores below ar is not
    tried on that margin alone (at a factor of 1 it was). A factor above 1 gives no untried mode a bonus,
    and alone (that overhead measured per tier) ar's factor is its own."""
    costs = {"draft": {1: 0.7}, "target": {n: 1.0 + 0.1 * n for n in FLAT}}
    planner = planner_with(costs)
    if together:
        in_a_batch(planner)
    assert planner.plan(1000, 0).mode == "ar"  # the draft does not pay at the mean acceptance
    planner.observe_rate(Plan(("target",), (), 0.0), ar_factor / costs["target"][1], 80)
    assert planner.realized["ar"] == pytest.approx(pooled(80, 80 / ar_factor))
    guess = planner.realized["ar"] if together and ar_factor < 1 else 1.0
    assert planner._realized("draft") == pytest.approx(guess)
    if together and ar_factor < 1:
        assert planner.plan(1000, 80).mode == "ar"


@pytest.mark.parametrize("together", [False, True])
def test_an_idle_modes_speed_factor_holds_in_a_batch(together):
    """Alone, the overhead between forwards is measured and an idle mode's factor fades back towards 1 (a draft
    measured at 0.6 over 60 tokens is tried again after about 90 tokens of `ar`); in a batch the factors carry
    what the model leaves out of a batch's rounds (its calls for fewer members, its loop), and a mode
    measured slow stays so while `ar` runs, instead of being tried again."""
    costs = {"draft": {1: 0.2}, "target": {n: 1.0 + 0.1 * n for n in FLAT}}
    planner = planner_with(costs)
    if together:
        in_a_batch(planner)
    plan = planner.plan(1000, 0)
    assert plan.mode == "draft"
    planner.observe_rate(plan, 0.6 / seconds_per_token(plan.stack, plan.gammas, costs,
                                                       {n: a.mean for n, a in planner.acceptance.items()}), 60)
    modes = []
    for i in range(1, 17):
        modes.append(planner.plan(1000, 8 * i).mode)
        if modes[-1] == "ar":
            planner.observe_rate(Plan(("target",), (), 0.0), 1 / costs["target"][1], 8)  # at its model
    assert modes[0] == "ar"
    if together:  # (its evidence kept RUNNING_KEPT at the plan that dropped it, and all of it since)
        dropped = realized.RUNNING_KEPT
        assert set(modes) == {"ar"}
        assert planner.realized["draft"] == pytest.approx(pooled(60 * dropped, 100 * dropped))
    else:
        assert "draft" in modes[1:]  # its factor faded back far enough to try it again


def test_a_modes_speed_factor_pools_its_stretches_and_starts_from_earlier_requests():
    """Stretches of `draft` at 1.15 of its model and then one at 0.73 (as at 4K of Emma and 0.6 on the
    Zen 4: realized.py): the factor pools them by tokens, so one odd stretch moves it a little (it had
    moved it halfway, to 0.94, and `triforce` ran on that); a request starts from what earlier ones
    measured, worth START_TOKENS, and a mode it has not run keeps that start."""
    speed = RealizedSpeed()
    speed.recall({"draft": 1.2, "triforce": 0.9})
    assert speed["draft"] == pytest.approx(1.2) and speed.own() == {}
    for _ in range(5):
        speed.observe("draft", 1.15, 20)
    speed.observe("draft", 0.73, 20)
    assert speed["draft"] == pytest.approx(pooled(120, 100 / 1.15 + 20 / 0.73, start=1.2))
    assert speed["draft"] > 1.05 and speed["triforce"] == pytest.approx(0.9)
    assert speed.own() == {"draft": speed["draft"]}
    speed.fade("triforce", 0.5)  # idle, the draft's evidence halves: towards its start
    assert speed["draft"] == pytest.approx(pooled(60, 50 / 1.15 + 10 / 0.73, start=1.2))
    speed.fade("draft", None)  # running, its evidence keeps RUNNING_KEPT; an idle mode's all where None
    kept = realized.RUNNING_KEPT / 2
    assert speed["draft"] == pytest.approx(pooled(120 * kept, kept * (100 / 1.15 + 20 / 0.73), start=1.2))


def test_a_speed_factor_seen_alone_is_not_pooled_with_one_seen_in_a_batch():
    """The factors seen beside batchmates carry what the model leaves out of a batch's rounds, which alone
    do not happen: where a request's batchmates come or go, each mode starts again from its start. A mode passes on only
    a factor it still holds evidence for (one that ran early and idled since is back near its start), and
    a start from a file is taken within START_RANGE."""
    speed = RealizedSpeed()
    speed.recall({"draft": 1e-12})
    assert speed["draft"] == pytest.approx(realized.START_RANGE[0])
    speed.fade(None, 0.9, together=False)
    speed.observe("draft", 2.0, 100)
    speed.fade("draft", 0.9, together=False)
    kept = realized.RUNNING_KEPT
    assert speed["draft"] == pytest.approx(pooled(100 * kept, 50 * kept, start=0.25))
    assert set(speed.own()) == {"draft"}
    speed.fade("draft", None, together=True)  # a batchmate joined
    assert speed["draft"] == pytest.approx(realized.START_RANGE[0]) and speed.own() == {}
    speed.observe("draft", 0.8, 40)
    assert speed["draft"] == pytest.approx(pooled(40, 50, start=0.25))
    assert set(speed.own()) == {"draft"}
    for _ in range(30):  # idle for long: its evidence faded
        speed.fade("ar", 0.85, together=True)
    assert speed.own() == {}


def test_a_stretch_of_poor_proposals_lowers_the_acceptance_not_the_modes_speed_factor():
    """A draft that a stretch of text defeats: 1 token accepted in 10 checks, and the mode ran at what
    the model predicts for that acceptance. Its realized factor (what the model leaves out) stays 1; only
    its acceptance estimate falls (before, measured against the prior-weighted estimate, the factor fell
    too, and the draft paid for the stretch twice: it lost its mode at the next plan on this evidence)."""
    costs = {"draft": {1: 0.1}, "target": {n: 1.0 + 0.1 * n for n in FLAT}}
    planner = planner_with(costs)
    planner.acceptance["draft"] = Acceptance(0.8, LEARNED_TRIALS)  # earlier requests saw 0.8
    plan = planner.plan(1000, 0)
    assert plan.mode == "draft"
    for _ in range(9):
        planner.observe("draft", plan.gammas[0], 0)
    planner.observe("draft", plan.gammas[0], 1)
    stretch = 1 / (10 + (plan.gammas[0] > 1))  # successes over trials: a failure at every check but a full one
    planner.observe_rate(plan, 1 / seconds_per_token(plan.stack, plan.gammas, costs, {"draft": stretch}), 14)
    assert planner.realized["draft"] == pytest.approx(1.0)
    assert planner.acceptance["draft"].mean < 0.8
    plan = planner.plan(1000, 10)
    planner.begin_stretch()  # the plan runs on (AutoEngine._adopt): a stretch without checks so far...
    alphas = {n: a.mean for n, a in planner.acceptance.items()}
    planner.observe_rate(plan, 1 / seconds_per_token(plan.stack, plan.gammas, costs, alphas), 20)
    assert planner.realized["draft"] == pytest.approx(1.0)  # ...is measured at the estimate, not the last one


def test_costs_past_the_largest_size_measured_never_fall():
    """Past the largest size measured, costs followed the last segment's slope, which on a GPU whose cost is
    flat is noise and may fall: 1.05 s at 12 tokens and 1.0 at 17 priced 129 tokens at nothing, and a real
    forward's time over that price scaled the tier's costs by about 1e8. Rising slopes are kept."""
    flat = {1: 1.0, 12: 1.05, 17: 1.0}
    assert [interpolate(flat, n) for n in (41, 129)] == [1.0, 1.0]
    rising = {1: 1.0, 8: 2.0, 16: 3.0}
    assert interpolate(rising, 32) == pytest.approx(5.0) and interpolate(rising, 12) == pytest.approx(2.5)
    assert interpolate({2: 1.0, 4: 0.9}, 1) == 1.0 and interpolate({2: 1.0, 4: 2.0}, 1) == pytest.approx(0.5)
    assert interpolate({4: 2.0}, 100) == 2.0


def test_a_forward_of_a_size_never_measured_does_not_scale_the_costs():
    """The draft is measured at 1 token: its 2-token forwards after a chain accepted whole scaled its cost
    by t(2) / t(1), as if it had slowed down. Only sizes within those measured teach the scale."""
    from triforce.coordinator.costs import CostTable
    from triforce.coordinator.forward_times import ForwardTimes

    times = ForwardTimes(CostTable(None))
    times.plan_with({"draft": {1: 0.01}, "target": {1: 0.1, 8: 0.2}}, 1, [("draft", "target")])
    times.observe_cost("draft", "draft", 2, 0.03)
    times.observe_cost("draft", "target", 12, 0.9)
    assert times.scale == {}
    times.observe_cost("draft", "draft", 1, 0.02)
    times.observe_cost("draft", "target", 4, 0.15)
    assert times.scale["draft"] > 1 and times.scale["target"] > 1
