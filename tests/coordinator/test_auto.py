"""`--mode auto`: the cost model, the planner's choices, the cost table, and exactness while the plan changes
between rounds (greedy equality with plain decoding; chi-square at alpha = 1e-3 for sampling)."""
import copy
from types import SimpleNamespace

import pytest
import torch
from scipy.stats import chisquare

import triforce.coordinator.auto as auto
import triforce.coordinator.forward_times as forward_times
import triforce.coordinator.planning as planning
import triforce.coordinator.speed_model as speed_model
from triforce.cache.full import FullKVCache
from triforce.config import ConfigError, EngineConfig, SamplingParams
from triforce.coordinator import costs as costs_module
from triforce.coordinator.batchmates import Batchmates, power_of_two_below
from triforce.coordinator.planning import AutoPlanner
from triforce.coordinator.speed_model import (STACK_MODES, Acceptance, Plan, check_sizes, check_yields,
                                              expected_tokens, seconds_per_token)
from triforce.coordinator.costs import CostTable, interpolate
from triforce.coordinator.hierarchy import build_engine
from triforce.models.loader import load_model
from triforce.speculation.lookup import RECENT
from triforce.speculation.sampling import probabilities

from sampling_runs import outputs
from scripted_planner import follow_script

ALPHA = 1e-3
VOCAB = 8
SETTINGS = dict(budget=12, chunk_size=4, full_layers=0, sinks=2, window=64, refresh_every=12)
FLAT = {n: 1.0 for n in (1, 2, 3, 4, 6, 9)}  # a check costs what one token does (a GPU, AMX tiles)


@pytest.fixture(scope="module")
def models(tiny_dir):
    spec = dict(vocab_size=VOCAB, hidden_size=64, num_heads=4, num_kv_heads=2, scale=4)
    target = load_model(tiny_dir("auto-target", seed=40, num_layers=3, **spec))
    draft = load_model(tiny_dir("auto-draft", seed=41, num_layers=1, **spec))
    return target, draft


@pytest.fixture
def prompt():
    return torch.randint(0, VOCAB, (80,), generator=torch.Generator().manual_seed(4)).tolist()


def test_expected_tokens_is_the_mean_of_a_chain_check():
    """E(alpha, gamma) against the accepted length's distribution written out: P(a = k) = alpha^k (1 - alpha)
    for k < gamma and alpha^gamma for k = gamma, plus the recovered or bonus token."""
    for alpha in (0.0, 0.3, 0.8, 1.0):
        for gamma in (1, 2, 5):
            mean = sum(k * alpha ** k * (1 - alpha) for k in range(gamma)) + gamma * alpha ** gamma + 1
            assert expected_tokens(alpha, gamma) == pytest.approx(mean)


def test_seconds_per_token_composes_the_levels():
    costs = {"draft": {1: 0.1}, "retrieval": {1: 0.5, 3: 0.7}, "target": {1: 1.0, 3: 1.2, 4: 1.5}}
    alphas = {"draft": 0.5, "retrieval": 0.9}
    assert seconds_per_token(("target",), (), costs, alphas) == 1.0
    assert seconds_per_token(("draft", "target"), (2,), costs, alphas) == pytest.approx((0.2 + 1.2) / 1.75)
    level1 = (2 * 0.1 + 0.7) / 1.75
    # the target's check takes every token of the retrieval tier's rounds (each yields 1, 2 or 3 tokens
    # with probability 1/2, 1/4, 1/4) once they reach 3: it holds 3, 4 or 5 tokens
    sizes = rounds_until(3, {1: 0.5, 2: 0.25, 3: 0.25})
    assert set(sizes) == {3, 4, 5}
    held = sum(n * p for n, p in sizes.items())
    target = {4: 1.5, 5: 1.8, 6: 2.1}  # c(n + 1), past 4 along the 3-4 slope
    level2 = (held * level1 + sum(p * target[n + 1] for n, p in sizes.items())) / sum(
        p * expected_tokens(0.9, n) for n, p in sizes.items())
    assert seconds_per_token(("draft", "retrieval", "target"), (2, 3), costs, alphas) == pytest.approx(level2)
    assert interpolate({1: 1.0, 3: 2.0}, 2) == 1.5 and interpolate({1: 1.0, 3: 2.0}, 5) == 3.0
    # every row a forward returns pays the sampling processing r
    with_rows = seconds_per_token(("draft", "target"), (2,), costs, alphas, row_seconds=0.01)
    assert with_rows == pytest.approx((2 * (0.1 + 0.01) + 1.2 + 3 * 0.01) / 1.75)


def rounds_until(gamma: int, round_yields: dict[int, float]) -> dict[int, float]:
    """Every sequence of rounds, each yielding k tokens with probability round_yields[k], until their sum
    reaches gamma, written out: the sum's distribution."""
    out: dict[int, float] = {}

    def walk(total, p):
        if total >= gamma:
            out[total] = out.get(total, 0.0) + p
            return
        for k, q in round_yields.items():
            walk(total + k, p * q)

    walk(0, 1.0)
    return out


@pytest.mark.parametrize("alpha,gamma1,gamma2", [(0.5, 2, 3), (0.8, 4, 6), (0.3, 1, 5), (1.0, 3, 2), (0.0, 3, 4)])
def test_a_check_above_a_checking_tier_holds_what_its_rounds_overshoot(alpha, gamma1, gamma2):
    """A check of gamma1 proposals yields k tokens with probability alpha^(k-1) (1 - alpha), up to
    gamma1 + 1 (all accepted); the check above takes the rounds' tokens once they reach gamma2."""
    yields = check_yields(alpha, {gamma1: 1.0})
    written = {k: alpha ** (k - 1) * (1 - alpha) for k in range(1, gamma1 + 1)} | {gamma1 + 1: alpha ** gamma1}
    assert yields == pytest.approx(written) and sum(yields.values()) == pytest.approx(1)
    assert sum(k * p for k, p in yields.items()) == pytest.approx(expected_tokens(alpha, gamma1))
    sizes = check_sizes(yields, gamma2)
    assert sizes == pytest.approx(rounds_until(gamma2, yields))
    assert min(sizes) >= gamma2 and max(sizes) <= gamma2 + gamma1


def draft_rate(costs: dict, gamma: int, alpha: float, row_seconds: float = 0.0) -> float:
    """Tokens/s the model gives `draft` mode at `gamma` and per-token acceptance `alpha`."""
    return 1 / seconds_per_token(("draft", "target"), (gamma,), costs, {"draft": alpha}, row_seconds)


def planner_with(costs: dict, context: int = 1000, budget: int = 100):
    planner = AutoPlanner({name: None for name in costs}, budget, table=CostTable(None))
    planner.costs = lambda stacks, measure=True: costs
    return planner


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
    # where the mean pays, the draft runs (plain decoding measured as the model predicts it)
    planner.observe_rate(plain, 1.0)
    paying = Acceptance(0.7, successes=2.8, trials=4.0)
    assert draft_rates(paying)[0] > 1.0
    planner.acceptance["draft"] = paying
    assert planner.plan(1000, 8).mode == "draft"


def test_plain_decoding_is_measured_before_a_plan_that_beats_it_by_little():
    """A request that has not run `ar` runs it for a stretch before a plan expected to beat it by less
    than AR_PROBE; then the plan runs, or `ar` stays if it ran faster than the model said."""
    costs = {"draft": {1: 0.3}, "target": {n: 1.0 + 0.02 * (n - 1) for n in FLAT}}
    acceptance = Acceptance(0.6, successes=600.0, trials=1000.0)
    expected = max(1 / seconds_per_token(("draft", "target"), (g,), costs, {"draft": acceptance.mean})
                   for g in range(1, planning.MAX_GAMMA + 1))
    assert 1.0 < expected < planning.AR_PROBE  # the case this test is about (ar: 1 token/s)
    for ar_rate, then in ((1.0, "draft"), (1.3 * expected, "ar")):
        planner = planner_with(costs)
        planner.acceptance["draft"] = copy.deepcopy(acceptance)
        probe = planner.plan(1000, 0)
        assert probe.mode == "ar" and planner.decisions[-1]["why"]["probe"]
        planner.observe_rate(probe, ar_rate)
        assert planner.plan(1000, 8).mode == then
        assert planner.plan(1000, 16).mode == then  # probed once
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


def test_a_draft_that_is_rejected_is_dropped():
    costs = {"draft": {1: 0.2}, "target": {n: 1.0 + 0.1 * n for n in FLAT}}
    planner = planner_with(costs)
    assert planner.plan(1000, 0).mode == "draft"  # the prior: a draft accepted 60% of the time pays
    for _ in range(20):
        planner.observe("draft", 4, 0)
    assert planner.plan(1000, 80).mode == "ar"
    kept = planning.EVIDENCE_KEPT
    assert planner.decisions[-1]["why"]["acceptance"]["draft"] == pytest.approx(
        (0.6 * 4) / (20 * kept + 4), abs=1e-3)  # the 20 rejections, counted once less at this plan
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
    plain = planner.plan(1000, 80)
    assert plain.mode == "ar"
    planner.observe_rate(plain, plain.tokens_per_s)  # its stretch ran as predicted
    without = copy.deepcopy(planner)
    planner.observe_idle("draft", 7.5, 8.0)  # 8 tokens of `ar`, where it would have done well
    assert planner.plan(1000, 88).mode == "draft"
    assert without.plan(1000, 88).mode == "ar"  # what the old evidence alone said


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
    kept = planning.EVIDENCE_KEPT
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
    assert calls == [(None, costs["target"], 1)]

    table = CostTable(tmp_path / "costs.json")
    config = ModelConfig(model_type="llama", vocab_size=8, hidden_size=16, intermediate_size=8, num_layers=2,
                         num_heads=2, num_kv_heads=1, head_dim=8, max_position_embeddings=64)
    model = SimpleNamespace(config=config, dtype=torch.float32, device=torch.device("cpu"))
    tier = SimpleNamespace(name="target", model=model, placement="local", cache=None, length=1000)
    table.entries[table._key(tier)] = {"1": 0.8, "4": 1.6}
    table.forget(tier, {1: 0.7})  # planned with another entry: measured again since
    assert CostTable(tmp_path / "costs.json").entries == {} and table.entries[table._key(tier)] == {"1": 0.8, "4": 1.6}
    table.forget(tier, {1: 0.8})
    assert table._key(tier) not in table.entries and not table.known(tier, (1,))
    assert CostTable(tmp_path / "costs.json").entries == {}  # gone on disk too


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
    table.entries[table._key(tiers["draft"], 4)] = {"1": 0.1}
    table.entries[table._key(tiers["target"], 4)] = {str(n): 1.0 for n in planning.CHECK_SIZES}
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
    planner.observe_rate(plan, 100.0)
    assert planner.times.scale == {} and planner.realized == {}
    plan = planner.plan(1000, 100)  # no batchmate to measure with: measured alone
    assert measured == [("draft", 1), ("target", 1)]
    planner.times.observe_cost(plan.mode, "target", 1, 0.5)
    planner.observe_rate(plan, 100.0)
    assert planner.times.scale["target"] < 1 and plan.mode in planner.realized


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


def test_a_mode_slower_than_its_model_is_dropped():
    """Sampling and verification between forwards are outside the cost model: a mode that runs at half
    the speed its forwards predict is scored at what it reached."""
    costs = {"draft": {1: 0.2}, "target": {n: 1.0 + 0.1 * n for n in FLAT}}
    planner = planner_with(costs)
    plan = planner.plan(1000, 0)
    assert plan.mode == "draft"
    planner.observe_rate(plan, 0.5 / seconds_per_token(plan.stack, plan.gammas, costs,
                                                       {n: a.mean for n, a in planner.acceptance.items()}))
    assert planner.realized["draft"] == pytest.approx(0.5)
    assert planner.plan(1000, 80).mode == "ar"  # which verifies nothing: its model is whole
    planner.observe_rate(Plan(("target",), (), 0.0), 0.4 / costs["target"][1])  # ar ran slower still
    assert planner.plan(1000, 160).mode == "draft"
    # idle while ar ran, the draft's factor faded towards its model: 1 - 0.5 x EVIDENCE_KEPT
    faded = 1 - 0.5 * planning.EVIDENCE_KEPT
    assert planner.realized["draft"] == pytest.approx(faded)
    # an untried speculative mode is guessed at the speculative modes' mean, not at ar's
    assert planner._realized("retrieval") == pytest.approx(faded)
    planner.plan(1000, 240)  # draft mode runs: ar's factor fades, the draft's stays
    assert 0.4 < planner.realized["ar"] < 1 and planner.realized["draft"] == pytest.approx(faded)


def in_a_batch(planner: AutoPlanner) -> AutoPlanner:
    """`planner` planning for a batch of two (a batchmate whose prompt is prefilled)."""
    planner.batchmates = Batchmates()
    for member in (planner, AutoPlanner({}, None)):
        planner.batchmates.join(SimpleNamespace(planner=member, plans=True))
    return planner


@pytest.mark.parametrize("together,ar_factor,guess", [(True, 0.8, 0.8), (True, 1.3, 1.0), (False, 0.8, 1.0)])
def test_an_untried_mode_in_a_batch_is_not_favoured_by_what_slowed_plain_decoding(together, ar_factor, guess):
    """In a batch, plain decoding ran at 0.8 of its model (the overhead between forwards, unmeasured there,
    as at batch 2 on the AVX2 EPYC) and no speculative mode has run: an untried one is guessed at ar's
    factor, since its rounds pay the same between forwards, so a draft the model scores below ar is not
    tried on that margin alone (at a factor of 1 it was). A factor above 1 gives no untried mode a bonus,
    and alone (that overhead measured per tier) ar's factor is its own."""
    costs = {"draft": {1: 0.7}, "target": {n: 1.0 + 0.1 * n for n in FLAT}}
    planner = planner_with(costs)
    if together:
        in_a_batch(planner)
    assert planner.plan(1000, 0).mode == "ar"  # the draft does not pay at the mean acceptance
    planner.observe_rate(Plan(("target",), (), 0.0), ar_factor / costs["target"][1])
    assert planner._realized("draft") == pytest.approx(guess)
    if together and ar_factor < 1:
        assert planner.plan(1000, 80).mode == "ar"


@pytest.mark.parametrize("together", [False, True])
def test_an_idle_modes_speed_factor_holds_in_a_batch(together):
    """Alone, the overhead between forwards is measured and an idle mode's factor fades back towards 1;
    in a batch that overhead is not measured (the time between a request's forwards holds its batchmates'),
    the factors carry it, and a mode measured slow stays so while `ar` runs, instead of being tried again."""
    costs = {"draft": {1: 0.2}, "target": {n: 1.0 + 0.1 * n for n in FLAT}}
    planner = planner_with(costs)
    if together:
        in_a_batch(planner)
    plan = planner.plan(1000, 0)
    assert plan.mode == "draft"
    planner.observe_rate(plan, 0.6 / seconds_per_token(plan.stack, plan.gammas, costs,
                                                       {n: a.mean for n, a in planner.acceptance.items()}))
    modes = []
    for i in range(1, 9):
        modes.append(planner.plan(1000, 8 * i).mode)
        if modes[-1] == "ar":
            planner.observe_rate(Plan(("target",), (), 0.0), 1 / costs["target"][1])  # at its model
    assert modes[0] == "ar"
    if together:
        assert set(modes) == {"ar"} and planner.realized["draft"] == pytest.approx(0.6)
    else:
        assert "draft" in modes[1:]  # its factor faded back far enough to try it again


def test_a_stretch_of_poor_proposals_lowers_the_acceptance_not_the_modes_speed_factor():
    """A draft that a stretch of text defeats: 1 token accepted in 10 checks, and the mode ran at what
    the model predicts for that acceptance. Its realized factor (what the model leaves out) stays 1; only
    its acceptance estimate falls (before, measured against the prior-weighted estimate, the factor fell
    too, and the draft paid for the stretch twice: it lost its mode at the next plan on this evidence)."""
    costs = {"draft": {1: 0.1}, "target": {n: 1.0 + 0.1 * n for n in FLAT}}
    planner = planner_with(costs)
    planner.acceptance["draft"] = Acceptance(0.8, planning.LEARNED_TRIALS)  # earlier requests saw 0.8
    plan = planner.plan(1000, 0)
    assert plan.mode == "draft"
    for _ in range(9):
        planner.observe("draft", plan.gammas[0], 0)
    planner.observe("draft", plan.gammas[0], 1)
    stretch = 1 / (10 + (plan.gammas[0] > 1))  # successes over trials: a failure at every check but a full one
    planner.observe_rate(plan, 1 / seconds_per_token(plan.stack, plan.gammas, costs, {"draft": stretch}))
    assert planner.realized["draft"] == pytest.approx(1.0)
    assert planner.acceptance["draft"].mean < 0.8
    plan = planner.plan(1000, 10)
    planner.begin_stretch()  # the plan runs on (AutoEngine._adopt): a stretch without checks so far...
    alphas = {n: a.mean for n, a in planner.acceptance.items()}
    planner.observe_rate(plan, 1 / seconds_per_token(plan.stack, plan.gammas, costs, alphas))
    assert planner.realized["draft"] == pytest.approx(1.0)  # ...is measured at the estimate, not the last one


@pytest.mark.parametrize("growth,expected", [(0.02, 0.0), (0.5, planning.STOP_BELOW)])
def test_chains_end_early_where_checks_grow_steeply(growth, expected):
    """With tiles a check of 4 tokens costs about one token's (growth 0.02 a token): chains run to gamma.
    Where each token adds half a token's cost (vector arithmetic), the draft ends a chain after an unsure
    proposal. The plan carries the choice and its record says it; a stop_below the user set wins."""
    costs = {"draft": {1: 0.05}, "target": {n: 1.0 + growth * (n - 1) for n in FLAT}}
    planner = planner_with(costs)
    planner.acceptance["draft"] = Acceptance(0.9, successes=9e3, trials=1e4)
    plan = planner.plan(1000, 0)
    assert plan.mode == "draft" and plan.stop_below == expected
    assert planner.decisions[-1]["stop_below"] == expected
    planner.fixed_stop = 0.2
    assert planner.plan(1000, 8).stop_below == 0.2 and planner.decisions[-1]["stop_below"] == 0.2



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

def test_auto_ends_chains_as_its_plans_say(models, prompt, replan_every_round):
    """Greedy still equals plain decoding while the plans change and chains end early (at 0.6 some do); a
    stop_below in the settings reaches the planner, and the request's priors are kept apart by it."""
    target, draft = models
    params = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
    reference, _ = build_engine(EngineConfig(mode="ar", **SETTINGS), target, None, 140).generate(prompt, params)
    engine = scripted_engine(models, prompt, 60, "triforce-first")
    engine.planner.stop = 0.6
    tokens, metrics = engine.generate(prompt, params)
    assert tokens == reference
    pair = next(t for t in metrics.tiers if (t.drafter, t.name) == ("draft", "retrieval"))
    assert 0 < pair.proposed < 3 * pair.checks  # some of the draft's chains of 3 (triforce-first) ended early
    assert build_engine(EngineConfig(mode="auto", stop_below=0.2, **SETTINGS), target, draft,
                        140).planner.fixed_stop == 0.2
    assert build_engine(EngineConfig(mode="auto", **SETTINGS), target, draft, 140).planner.fixed_stop is None


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


def test_cost_table_measures_once_per_machine_model_and_context(models, tmp_path, monkeypatch):
    from triforce.coordinator.verifier import LocalVerifier

    target, _ = models
    verifier = LocalVerifier(target, 400)
    verifier.prefill(list(range(VOCAB)) * 25)  # 200 tokens
    path = tmp_path / "costs-2.json"
    table = CostTable(path)
    first = table.seconds(verifier, (1, 3))
    assert set(first) == {1, 3} and all(s > 0 for s in first.values()) and verifier.length == 200
    assert path.is_file()

    def no_measuring(tier, n, batch=1):
        raise AssertionError("measured again")

    monkeypatch.setattr(costs_module, "forward_seconds", no_measuring)
    assert CostTable(path).seconds(verifier, (1, 3)) == first  # another process on this machine reuses it
    verifier.prefill([1] * 20)  # 10% more context: the same entry
    assert CostTable(path).seconds(verifier, (1, 3)) == first
    verifier.prefill([1] * 100)  # 60% more: measured anew
    with pytest.raises(AssertionError, match="measured again"):
        CostTable(path).seconds(verifier, (1,))


@pytest.mark.parametrize("policy", ["static", "dynamic"])
def test_an_idle_retrieval_tier_is_kept_at_the_context_it_runs_at(models, prompt, tmp_path, monkeypatch, policy):
    """An idle retrieval cache holds nothing until it is synced (for its measurement, or when a plan takes
    it): its cost is kept at the context it reads once synced, so the entry is found before and after the
    sync. Keyed at 0, a machine's first auto request measured the tier again at its next plan, in the
    middle of decoding, and the planner's check for known costs missed it."""
    target, draft = models
    engine = build_engine(EngineConfig(mode="retrieval", retrieval_policy=policy, **SETTINGS), target, draft, 128)
    retrieval, verifier = engine.tiers
    verifier.prefill(prompt)
    synced = SETTINGS["budget"] if policy == "static" else len(prompt)
    assert retrieval.length == 0 and costs_module.cost_context(retrieval) == synced
    table = CostTable(tmp_path / "costs-2.json")
    first = table.seconds(retrieval, (1, 3), retrieval.sync)
    assert retrieval.length == len(prompt) and costs_module.cost_context(retrieval) == synced
    assert table.known(retrieval, (1, 3))
    monkeypatch.setattr(costs_module, "forward_seconds", lambda tiers, n: pytest.fail("measured again"))
    assert table.seconds(retrieval, (1, 3), retrieval.sync) == first


def test_a_drafts_cost_is_measured_over_a_full_window(models, tmp_path, monkeypatch):
    """Auto plans before it prefills the tiers it runs: a draft measured then, over its empty streaming
    cache, read and rotated no keys and cost about half its step in the request. The measurement fills
    the window with filler first and leaves the cache as it found it."""
    from triforce.cache.streaming import StreamingKVCache
    from triforce.coordinator.tiers import Tier

    _, draft = models
    cache = StreamingKVCache(draft.config, 2, 16, 8, draft.rope, draft.dtype, "cpu")
    tier = Tier("draft", draft, cache)
    starts, forward_together = [], costs_module.forward_together
    monkeypatch.setattr(costs_module, "forward_together", lambda tiers, steps, logits_for: starts.append(
        [(s.start, s.n, lf) for s, lf in zip(steps, logits_for)]) or forward_together(tiers, steps, logits_for))
    CostTable(tmp_path / "costs-2.json").seconds(tier, (1,))
    measured = [call[0][0] for call in starts if call[0][2] == "all"]
    assert measured == [18, 18] and tier.length == 0 and costs_module.cost_context(tier) == 18


def test_a_batch_is_measured_as_one_call_of_all_its_sequences(models, tmp_path, monkeypatch):
    """A batch's cost: one call of every sequence's tier (each over its own cache), keyed by the batch
    size, every cache as it was after."""
    from triforce.coordinator.verifier import LocalVerifier

    target, _ = models
    verifiers = [LocalVerifier(target, 400) for _ in range(4)]
    for i, v in enumerate(verifiers):
        v.prefill(list(range(VOCAB)) * (25 + i))
    spent = [v.seconds for v in verifiers]
    table = CostTable(tmp_path / "costs-2.json")
    calls = []
    real = type(target).forward_batch

    def forward_batch(self, steps, caches, logits_for="all"):
        calls.append([id(c) for c in caches])
        return real(self, steps, caches, logits_for)

    monkeypatch.setattr(type(target), "forward_batch", forward_batch)
    alone, together = table.seconds(verifiers[0], (1, 3)), table.seconds(verifiers, (1, 3))
    assert [len(c) for c in calls] == [1] * 4 + [4] * 4  # two runs of each size, alone, then the four
    assert all(len(set(c)) == len(c) for c in calls)  # each sequence over its own cache
    assert [v.length for v in verifiers] == [200, 208, 216, 224] and [v.seconds for v in verifiers] == spent
    assert sorted(key.rsplit("||", 2)[1].endswith("|batch=4") for key in table.entries) == [False, True]
    assert set(together) == {1, 3} and together != alone
    assert table.seconds(verifiers, (1, 3)) == together and len(calls) == 8  # kept, not measured again


class FixedBatch(Batchmates):
    """A batch of `n` prefilled requests, as far as a planner can tell."""

    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def size(self, planner):
        return power_of_two_below(self.n)


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
    planner.observe_rate(plan, plan.tokens_per_s / 8)
    assert planner.realized["triforce"] == pytest.approx(1.0)


SCRIPTS = {
    "ar-only": [(("target",), ())],
    "ar-first": [(("target",), ()), (("draft", "retrieval", "target"), (2, 2)), (("retrieval", "target"), (3,)),
                 (("draft", "target"), (2,))],
    "triforce-first": [(("draft", "retrieval", "target"), (3, 1)), (("target",), ()), (("draft", "target"), (1,)),
                       (("retrieval", "target"), (2,))],
    # The first plan is made after the prefill, the second before round 1: round 1 runs ar (one token), so
    # the second token always comes from a stack that joined after it.
    "ar-then-triforce": [(("target",), ()), (("target",), ()), (("draft", "retrieval", "target"), (2, 2)),
                         (("draft", "target"), (2,))],
    "ar-then-retrieval": [(("target",), ()), (("target",), ()), (("retrieval", "target"), (3,)),
                          (("draft", "retrieval", "target"), (1, 2))],
    # budgets 12, 24 and 48 (auto_budgets), swapped between rounds
    "budgets": [(("draft", "retrieval@24", "target"), (2, 3)), (("retrieval@48", "target"), (3,)),
                (("draft", "retrieval", "target"), (2, 2)), (("draft", "target"), (2,))],
}


def scripted_engine(models, prompt, max_tokens, script, policy="static", **settings):
    target, draft = models
    engine = build_engine(EngineConfig(mode="auto", retrieval_policy=policy, **SETTINGS, **settings), target, draft,
                          len(prompt) + max_tokens)
    return follow_script(engine, SETTINGS["budget"], SCRIPTS[script])


@pytest.fixture
def replan_every_round(monkeypatch):
    monkeypatch.setattr(auto, "REPLAN_ROUNDS", 1)
    monkeypatch.setattr(auto, "MIN_PLANNED_TOKENS", 1)


def test_overhead_per_draft_step_shortens_the_chains():
    """A draft step's overhead (sampling, lookup, bookkeeping past the row cost) is paid gamma times per
    check: planned for, it shortens the chains a forward's cost alone would choose."""
    costs = {"draft": {1: 0.05}, "target": dict(FLAT)}
    planner = planner_with(costs)
    planner.acceptance["draft"] = Acceptance(0.8, successes=8e3, trials=1e4)
    planner.row_seconds = 0.01
    long = planner.plan(1000, 0).gammas[0]
    for _ in range(50):
        planner.times.observe_overhead("draft", "bottom", 0.16, 1, planner.row_seconds)  # 0.15 past its row's 0.01
    assert planner.times.overhead["draft/bottom"] == pytest.approx(0.15)
    short = planner.plan(1000, 8).gammas[0]
    alpha = planner.acceptance["draft"].mean  # a mode's gammas are picked at the mean
    costs["draft"] = {1: 0.2}
    assert short < long and short == max(range(1, planning.MAX_GAMMA + 1),
                                         key=lambda g: draft_rate(costs, g, alpha, 0.01))


def test_the_time_between_forwards_is_each_tiers_overhead_in_its_role(models, prompt, monkeypatch):
    """What passes between one forward and the next is charged to the first's tier in its role (it
    proposes: "bottom"; it checks: "check"), past its rows' modelled cost; never across a plan (whose
    catch-up forwards and own time are no forward's overhead), so each stretch of a plan with k forwards
    gives k - 1."""
    monkeypatch.setattr(auto, "REPLAN_ROUNDS", 3)
    engine = scripted_engine(models, prompt, 60, "triforce-first")
    planner, seen, forwards, stretches = engine.planner, [], [0], [0]
    times = planner.times
    observe_overhead, observe_cost, begin_stretch = times.observe_overhead, times.observe_cost, planner.begin_stretch
    times.observe_overhead = lambda name, role, seconds, rows, r: seen.append((name, role, seconds, rows, planner.running)) \
        or observe_overhead(name, role, seconds, rows, r)
    times.observe_cost = lambda *a: forwards.__setitem__(0, forwards[0] + 1) or observe_cost(*a)
    planner.begin_stretch = lambda: stretches.__setitem__(0, stretches[0] + 1) or begin_stretch()
    engine.generate(prompt, SamplingParams(max_tokens=60, temperature=0, ignore_eos=True))
    stacks = {mode: stack for stack, mode in STACK_MODES.items()}
    roles = {(stack[0], "bottom") for stack in stacks.values()} | {(n, "check") for s in stacks.values() for n in s[1:]}
    assert {(name, role) for name, role, *_ in seen} <= roles
    assert all((name, role) == (stacks[running][0], "bottom") or name in stacks[running][1:]
               for name, role, _, _, running in seen)
    assert all(seconds >= 0 and (rows == 1 if role == "bottom" else rows >= 1) for _, role, seconds, rows, _ in seen)
    assert {name for name, *_ in seen} == {"draft", "retrieval", "target"}
    assert len(seen) == forwards[0] - stretches[0] > 0
    assert set(times.overhead) == {f"{name}/{role}" for name, role, *_ in seen}


@pytest.mark.parametrize("script", ["ar-first", "triforce-first"])
@pytest.mark.parametrize("policy", ["static", "dynamic"])
def test_greedy_equals_plain_decoding_while_the_plan_changes(models, prompt, script, policy, replan_every_round):
    target, draft = models
    params = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
    reference, _ = build_engine(EngineConfig(mode="ar", **SETTINGS), target, None, 140).generate(prompt, params)
    engine = scripted_engine(models, prompt, 60, script, policy)
    tokens, metrics = engine.generate(prompt, params)
    assert tokens == reference
    assert engine.planner.calls > 8  # every plan of the script ran, twice
    pairs = {(t.drafter, t.name) for t in metrics.tiers if t.checks}
    assert pairs == {("draft", "retrieval"), ("retrieval", "target"), ("draft", "target")}
    assert metrics.auto == engine.planner.decisions


@pytest.mark.parametrize("policy", ["static", "dynamic"])
def test_budgets_swap_exactly_and_an_idle_one_frees_its_cache(models, prompt, policy, replan_every_round):
    """The plan moves between the retrieval tiers of three budgets: greedy equals plain decoding, each
    budget's cache chooses chunks (80 tokens: more than any budget), and at every plan only the running
    plan's retrieval tier holds a cache (the memory check counts two: one running, one built to measure)."""
    target, _ = models
    params = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
    reference, _ = build_engine(EngineConfig(mode="ar", **SETTINGS), target, None, 140).generate(prompt, params)
    engine = scripted_engine(models, prompt, 60, "budgets", policy)
    retrieval = [t for t in engine.ladder if t.name.startswith("retrieval")]
    assert [t.cache.budget for t in retrieval] == [12, 24, 48]
    held, chosen, plan = [], set(), engine.planner.plan

    def plan_and_look(*args, **kwargs):
        running = [t for t in retrieval if t in engine.tiers] if engine.planner.calls else []
        held.append({t.name for t in retrieval if t.length} - {t.name for t in running})
        if policy == "static":  # its budget's chunks and the incomplete one, not the whole cache
            chosen.update((t.cache.budget, n) for t in running for n in t.cache._retrieved)
        return plan(*args, **kwargs)

    engine.planner.plan = plan_and_look
    tokens, metrics = engine.generate(prompt, params)
    assert tokens == reference
    assert engine.planner.calls > 8 and held and not any(held)
    pairs = {(t.drafter, t.name) for t in metrics.tiers if t.checks}
    assert {("draft", "retrieval@24"), ("retrieval@24", "target"), ("retrieval@48", "target"),
            ("draft", "retrieval")} <= pairs
    if policy == "static":
        assert {budget for budget, _ in chosen} == {12, 24, 48}
        assert all(budget <= n < budget + SETTINGS["chunk_size"] for budget, n in chosen)


@pytest.mark.parametrize("script,trials", [("ar-then-triforce", 2000), ("ar-then-retrieval", 2000)])
def test_second_token_follows_the_target_while_the_plan_changes(models, prompt, script, trials, replan_every_round):
    """The second token's marginal, sum over x1 of p(x1) p(x2 | x1), against runs that produce it with tiers
    that joined after the first token (the draft catches up on the tokens it missed, the retrieval tier
    syncs)."""
    target, _ = models
    cache = FullKVCache(target.config, len(prompt) + 2, target.rope, target.dtype, "cpu")
    first = probabilities(target(torch.tensor(prompt), cache, logits_for="last"), 1.0, 0, 1.0)[0]
    expected = torch.zeros(VOCAB, dtype=torch.float64)
    for x1 in range(VOCAB):
        logits = target(torch.tensor([x1]), cache, logits_for="last")
        cache.rollback(1)
        expected += first[x1].double() * probabilities(logits, 1.0, 0, 1.0)[0].double()

    def run(seed):
        engine = scripted_engine(models, prompt, 2, script)
        tokens, metrics = yield from engine.run(prompt, SamplingParams(max_tokens=2, temperature=1.0, seed=seed,
                                                                       ignore_eos=True))
        # three plans (after the prefill, before rounds 1 and 2): round 2 checked with the joined tiers
        assert engine.planner.calls == 3 and all(t.checks for t in metrics.tiers) and metrics.tiers
        return tokens, metrics

    counts = torch.zeros(VOCAB, dtype=torch.float64)
    for tokens in outputs(run, range(trials)):  # in batches, each as it runs alone (tests/sampling_runs.py)
        counts[tokens[1]] += 1
    assert chisquare(counts.numpy(), (expected / expected.sum() * trials).numpy()).pvalue > ALPHA


def test_auto_with_measured_costs_equals_plain_decoding(models, prompt, calibration):
    target, draft = models
    params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
    reference, _ = build_engine(EngineConfig(mode="ar", **SETTINGS), target, None, 128).generate(prompt, params)
    tokens, metrics = build_engine(EngineConfig(mode="auto", **SETTINGS), target, draft, 128).generate(prompt, params)
    assert tokens == reference
    decision = metrics.auto[0]
    assert decision["mode"].partition("@")[0] in STACK_MODES.values() and decision["at_token"] == 0
    # the retrieval tiers of budgets 12 and 24 (80 tokens >= 2 x 24), not of 48
    assert set(decision["why"]["forward_ms"]) == {"draft", "retrieval", "retrieval@24", "target"}
    assert (calibration / "costs-2.json").is_file()
    assert "auto" in metrics.to_dict()


@pytest.mark.parametrize("policy", ["static", "dynamic"])
def test_a_batch_in_auto_mode_plans_for_the_batch_and_equals_plain_decoding(models, calibration, policy):
    """Three requests run together on one plan, made by the first that plans for the batch (costs measured
    with the other one that plans: the second is too short to, and never leads), then by the third once
    the first has ended; each equals plain decoding alone."""
    from triforce.coordinator.batch import SequenceBatch

    target, draft = models
    g = torch.Generator().manual_seed(9)
    batch_prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (80, 64, 96)]
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (40, 20, 160)]
    plain = [build_engine(EngineConfig(mode="ar", **SETTINGS), target, None, 260).generate(p, sp)[0]
             for p, sp in zip(batch_prompts, params)]
    mates = Batchmates()
    cfg = EngineConfig(mode="auto", **{**SETTINGS, "retrieval_policy": policy})
    engines = [build_engine(cfg, target, draft, 260, batchmates=mates) for _ in batch_prompts]
    led = []  # the third request's own plans: it plans only as the leader
    third_plan = engines[2].planner.plan
    engines[2].planner.plan = lambda context, generated, *rest: led.append(engines[0] in mates.engines) or \
        third_plan(context, generated, *rest)
    batch = SequenceBatch()
    handles = [batch.add(e.run(p, sp)) for e, p, sp in zip(engines, batch_prompts, params)]
    assert mates.engines == engines
    batch.run()
    assert [h.result[0] for h in handles] == plain and mates.engines == [] and mates.plan is None
    plans = [handles[0].result[1].auto, handles[2].result[1].auto]
    assert handles[1].result[1].auto is None  # 20 tokens: plain decoding, no plan, never the leader
    assert all(p[0]["why"]["batch"] == 2 for p in plans)
    assert (plans[0][0]["mode"], plans[0][0]["gammas"]) == (plans[1][0]["mode"], plans[1][0]["gammas"])
    assert plans[1][0].get("from") == "the batch's leader"
    assert led and not any(led)  # it led once the first had ended (120 tokens after it: 13 rounds or more)
    costs = CostTable(calibration / "costs-2.json").entries
    assert any("|batch=2||" in key for key in costs)


def test_short_requests_decode_plainly_without_measuring(models, prompt, calibration):
    target, draft = models
    engine = build_engine(EngineConfig(mode="auto", **SETTINGS), target, draft, 100)
    tokens, metrics = engine.generate(prompt, SamplingParams(max_tokens=auto.MIN_PLANNED_TOKENS - 1, ignore_eos=True))
    assert len(tokens) == auto.MIN_PLANNED_TOKENS - 1 and metrics.tiers == [] and not metrics.auto
    assert not any(calibration.iterdir())


def test_auto_takes_no_trees():
    with pytest.raises(ConfigError, match="mode auto plans chains"):
        EngineConfig(mode="auto", tree1=4)


def test_forwards_beside_a_batchmates_prompt_teach_the_planner_nothing(models, calibration):
    """A request decodes in auto mode when another's long prompt arrives: the forwards that ran beside the
    newcomer's prompt chunks (slowed by them) neither scale the planner's costs nor count as the running
    mode's speed; what a chunk adds is learned apart and planned with while the prefill lasts; the output
    still equals plain decoding."""
    from triforce.coordinator.batch import SequenceBatch

    target, draft = models
    g = torch.Generator().manual_seed(11)
    # 9 chunks of 8 to prefill; 160 new tokens outlast them even at 9 tokens per check
    decoding, arriving = (torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (80, 72))
    params = SamplingParams(max_tokens=160, temperature=0, ignore_eos=True)
    plain = build_engine(EngineConfig(mode="ar", **SETTINGS), target, None, 400).generate(decoding, params)[0]
    mates = Batchmates()
    cfg = EngineConfig(mode="auto", **{**SETTINGS, "prefill_chunk": 8})
    first, second = (build_engine(cfg, target, draft, 400, batchmates=mates) for _ in range(2))
    learned = []  # whether the first request's tier had shared its call, at each cost or rate it learned
    target_tier = first.planner.tiers["target"]
    observe_cost, observe_rate = first.planner.times.observe_cost, first.planner.observe_rate
    first.planner.times.observe_cost = lambda mode, name, *a: learned.append(first.planner.tiers[name].shared_prefill) \
        or observe_cost(mode, name, *a)
    first.planner.observe_rate = lambda *a: learned.append(first._shared) or observe_rate(*a)
    planned, plan = [], first.planner.plan  # (round, busy) of each of its plans
    chunk_rounds, observe_chunk = [], first.planner.times.observe_chunk  # rounds in which a chunk's cost was seen
    first.planner.times.observe_chunk = lambda *a: chunk_rounds.append(first.rounds) or observe_chunk(*a)
    first.planner.plan = lambda context, generated, busy=False, measure=True: planned.append((first.rounds, busy)) or \
        plan(context, generated, busy, measure)
    batch = SequenceBatch()
    handle = batch.add(first.run(decoding, params))
    while first.rounds < 2:
        batch.step()
    batch.add(second.run(arriving, params))
    shared = []
    while batch.active:
        batch.step()
        shared.append(target_tier.shared_prefill)
    assert handle.result[0] == plain
    assert max(shared) > 0  # some of its checks ran beside the newcomer's chunks
    assert learned and not any(learned)
    # It planned again as soon as the chunks' cost was known (not only every REPLAN_ROUNDS), with it, and
    # again without it once the newcomer's prompt was in.
    busy = [r for r, b in planned if b]
    assert busy and busy[0] == chunk_rounds[0] + 1 and first.planner.times.chunk_seconds > 0  # the next round
    assert any(not b for r, b in planned if r > busy[-1])


def test_a_follower_replans_once_when_a_batchmates_prefill_ends(models, calibration):
    """A short request leads its batch while a longer one that joined first prefills, and plans for the
    chunks beside its checks; when the prefill ends the longer one leads. The short one takes the new
    plan once: before, as a follower it never recorded that the prefill had ended, re-planned every round
    and faded its acceptance evidence each time (0.85 a round instead of every REPLAN_ROUNDS)."""
    from triforce.coordinator.batch import SequenceBatch

    target, draft = models
    g = torch.Generator().manual_seed(12)
    long_prompt, short_prompt = (torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (96, 16))
    params = SamplingParams(max_tokens=160, temperature=0, ignore_eos=True)
    mates = Batchmates()
    cfg = EngineConfig(mode="auto", **{**SETTINGS, "prefill_chunk": 8})
    first, second = (build_engine(cfg, target, draft, 400, batchmates=mates) for _ in range(2))
    busy_plans, fades, fade = [], [], second.planner.fade
    plan = second.planner.plan
    second.planner.plan = lambda context, generated, busy=False, measure=True: busy_plans.append(busy) or \
        plan(context, generated, busy, measure)
    second.planner.fade = lambda: fades.append((second.rounds, first.prefilled)) or fade()
    batch = SequenceBatch()
    batch.add(first.run(long_prompt, params))
    batch.add(second.run(short_prompt, params))
    batch.run()
    assert any(busy_plans)  # it led while the first prefilled, planning with the chunks' cost
    after = [rounds for rounds, prefilled in fades if prefilled]
    assert after and len(after) <= (after[-1] - after[0]) // auto.REPLAN_ROUNDS + 2


def test_the_draft_is_prefilled_with_the_prompt_whatever_the_first_plan(models, prompt):
    """The draft's window is prefilled with the target's (prefill time), before the first plan, even one
    that runs `ar`: a draft that joins later catches up on a few tokens, not its window mid-decode."""
    engine = scripted_engine(models, prompt, 40, "ar-only")
    draft, first_plan = engine.planner.tiers["draft"], []
    plan = engine.planner.plan
    engine.planner.plan = lambda context, generated, *rest: first_plan.append(draft.length) or \
        plan(context, generated, *rest)
    engine.generate(prompt, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    assert first_plan[0] == len(prompt) - 1  # all but the last prompt token, as the target holds it


def lookup_mixture(q, sequence, first, n):
    """The prompt lookup's mixture of each row of q (the proposer's distribution for sequence[first + i]),
    computed naively: the candidate is the token after the latest earlier occurrence of the n tokens before,
    weighted by (right + 1) / (count + 2) over the latest RECENT earlier positions that had a candidate."""
    outcomes, mixed = [], q.clone()
    for j in range(n, len(sequence)):
        key = sequence[j - n:j]
        candidate = next((sequence[s + n] for s in range(j - n - 1, -1, -1) if sequence[s:s + n] == key), None)
        if candidate is None:
            continue
        weight = (sum(outcomes[-RECENT:]) + 1) / (len(outcomes[-RECENT:]) + 2)
        if first <= j < first + len(q):
            mixed[j - first] *= 1 - weight
            mixed[j - first, candidate] += weight
        outcomes.append(candidate == sequence[j])
    return mixed


@pytest.mark.parametrize("temperature,lookup", [(0.0, 0), (1.0, 0), (0.0, 3), (1.0, 3)])
def test_an_idle_draft_reports_how_its_proposals_would_have_fared(models, temperature, lookup, monkeypatch):
    """While `ar` runs, the draft catches up at each re-plan and reports, for each generated token x, the
    chance min(1, q(x) / p(x)) that its proposal there would have been accepted (greedy: whether its argmax
    is x), q mixed with the prompt lookup's copy as a chain proposes: the same sums as the draft and the
    target over the whole output in one forward each, and a lookup computed naively."""
    monkeypatch.setattr(auto, "REPLAN_ROUNDS", 4)
    monkeypatch.setattr(auto, "MIN_PLANNED_TOKENS", 1)
    target, draft = models
    prompt = torch.randint(0, VOCAB, (20,), generator=torch.Generator().manual_seed(5)).tolist()
    engine = scripted_engine(models, prompt, 40, "ar-only", lookup=lookup)  # 60 tokens: all in the draft's window
    seen = []
    engine.planner.observe_idle = lambda name, accepted, tokens: seen.append((name, accepted, tokens))
    tokens, _ = engine.generate(prompt, SamplingParams(max_tokens=40, temperature=temperature, seed=3,
                                                       ignore_eos=True))
    # re-plans before rounds 4, 8, ..., 40: the first sees 3 tokens, each later one 4 more
    assert {name for name, _, _ in seen} == {"draft"} and [n for _, _, n in seen] == [3] + [4] * 9
    covered = 39
    sequence = torch.tensor(prompt + tokens)

    def probs(model):
        cache = FullKVCache(model.config, len(sequence), model.rope, model.dtype, "cpu")
        return probabilities(model(sequence[:-1], cache), temperature, 0, 1.0)[len(prompt) - 1:]

    rows = torch.arange(covered)
    x = sequence[len(prompt):][:covered]
    q = probs(draft)[:covered]
    if lookup:
        q = lookup_mixture(q, sequence.tolist(), len(prompt), lookup)
        if temperature == 0:  # a greedy chain proposes the mixture's argmax
            q = torch.nn.functional.one_hot(q.argmax(dim=-1), VOCAB).float()
    q, p = q[rows, x], probs(target)[rows, x]
    expected = torch.minimum(torch.ones(covered), q / p).sum()
    assert sum(a for _, a, _ in seen) == pytest.approx(float(expected), rel=1e-4)
    assert 0 < expected < covered  # a draft neither always right nor always wrong here
