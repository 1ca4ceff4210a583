"""`--mode auto` running (auto.py): the cost table measured on real tiers, and exactness while the plan
changes between rounds (greedy equality with plain decoding; chi-square at alpha = 1e-3 for sampling).
The cost model and the planner's choices on given costs: test_speed_model.py, test_planning.py."""
import time
from types import SimpleNamespace

import pytest
import torch
from scipy.stats import chisquare

import triforce.coordinator.auto as auto
from triforce.cache.full import FullKVCache
from triforce.config import ConfigError, EngineConfig
from triforce.sampling_params import SamplingParams
from triforce.coordinator import costs as costs_module
from triforce.coordinator.batchmates import Batchmates
from triforce.coordinator.speed_model import STACK_MODES, stop_names
from triforce.coordinator.costs import CostTable
from triforce.coordinator.hierarchy import build_engine
from triforce.models.loader import load_model
from triforce.speculation.lookup import RECENT
from triforce.step import Step
from triforce.speculation.sampling import probabilities

from sampling_runs import outputs
from scripted_planner import follow_script

ALPHA = 1e-3
VOCAB = 8
SETTINGS = dict(budget=12, chunk_size=4, full_layers=0, sinks=2, window=64, refresh_every=12)


@pytest.fixture(scope="module")
def models(tiny_dir):
    spec = dict(vocab_size=VOCAB, hidden_size=64, num_heads=4, num_kv_heads=2, scale=4)
    target = load_model(tiny_dir("auto-target", seed=40, num_layers=3, **spec))
    draft = load_model(tiny_dir("auto-draft", seed=41, num_layers=1, **spec))
    return target, draft


@pytest.fixture
def prompt():
    return torch.randint(0, VOCAB, (80,), generator=torch.Generator().manual_seed(4)).tolist()


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


STOP = 0.3  # the tiny models' top probabilities (8 tokens) fall on both sides of it


def test_auto_learns_how_the_drafts_chains_end_and_how_their_tokens_fare(models, prompt, replan_every_round):
    """With the stop on, each chain the draft proposes says how far it went on and, up to the check's first
    rejection, how its tokens fared, sure or not (speed_model.STOP_RATES); an idle draft's watch says it
    of the positions it covers at the same threshold. The estimates hold exactly that evidence (the
    scripted planner does not fade it)."""
    engine = scripted_engine(models, prompt, 60, "triforce-first")
    planner = engine.planner
    planner.stop = planner.fixed_stop = STOP
    chains, watches = [], []
    observe_chain, observe_idle_stops = planner.observe_stopped_chain, planner.observe_idle_stops
    planner.observe_stopped_chain = lambda proposer, went_on, accepted: \
        chains.append((proposer, list(went_on), accepted)) or observe_chain(proposer, went_on, accepted)
    planner.observe_idle_stops = lambda proposer, sure, unsure: \
        watches.append((proposer, sure, unsure)) or observe_idle_stops(proposer, sure, unsure)
    tokens, metrics = engine.generate(prompt, SamplingParams(max_tokens=60, temperature=0.6, seed=3, ignore_eos=True))
    # the draft's chains (triforce, draft) and the retrieval tier's (retrieval mode: it is the bottom tier)
    assert {proposer for proposer, *_ in chains} == {"draft", "retrieval"} and {w[0] for w in watches} == {"draft"}
    for proposer in ("draft", "retrieval"):
        ran = [(went_on, accepted) for name, went_on, accepted in chains if name == proposer]
        # a chain ends at the first token its proposer was unsure of, or at its gamma (3 or 1 for the draft,
        # 2 for the retrieval tier)
        assert all(False not in went_on[:-1] for went_on, _ in ran)
        assert any(not went_on[-1] for went_on, _ in ran)
        assert proposer != "draft" or any(True in went_on for went_on, _ in ran)  # (tiny: the draft is sure at times)
        seen = [w for w in watches if w[0] == proposer]
        goes_on, sure, unsure = (planner.acceptance[name] for name in stop_names(proposer))
        assert goes_on.trials == pytest.approx(sum(len(w) for w, _ in ran) + sum(s[1] + u[1] for _, s, u in seen))
        assert goes_on.successes == pytest.approx(sum(sum(w) for w, _ in ran) + sum(s[1] for _, s, _ in seen))
        tried = [(was_sure, i < accepted) for went_on, accepted in ran for i, was_sure in enumerate(went_on[:accepted + 1])]
        for estimate, kind, at in ((sure, True, 1), (unsure, False, 2)):
            assert estimate.trials == pytest.approx(sum(k == kind for k, _ in tried) + sum(w[at][1] for w in seen))
            assert estimate.successes == pytest.approx(sum(k == kind and ok for k, ok in tried) +
                                                       sum(w[at][0] for w in seen))
    draft_checks = [t for t in metrics.tiers if t.drafter == "draft"]
    assert sum(len(w) for name, w, _ in chains if name == "draft") == sum(t.proposed for t in draft_checks)
    assert sum(a for name, _, a in chains if name == "draft") == sum(t.accepted for t in draft_checks)


def test_a_drafts_chains_that_do_not_stop_still_teach_where_they_would_have(models, prompt, replan_every_round):
    """Plans that run the draft's chains to gamma (stop_below 0, as `draft` mode's mostly are): each chain
    still notes, at the planner's threshold, where a stopping chain would have ended, up to its first unsure
    token, and its check's tokens up to there are evidence of the STOP_RATES that plans which stop chains
    are predicted from. The chains themselves run whole; the retrieval tier's chains note nothing."""
    engine = scripted_engine(models, prompt, 60, "ar-first")
    planner = engine.planner
    planner.fixed_stop = STOP  # the threshold (stop_threshold); the scripted plans' own stop_below stays 0
    chains = []
    observe_chain = planner.observe_stopped_chain
    planner.observe_stopped_chain = lambda proposer, went_on, accepted: \
        chains.append((proposer, list(went_on), accepted)) or observe_chain(proposer, went_on, accepted)
    planner.draft_upside = 0.0  # (no idle watch: every piece of evidence below is a running chain's)
    tokens, metrics = engine.generate(prompt, SamplingParams(max_tokens=60, temperature=0.6, seed=3, ignore_eos=True))
    assert chains and {proposer for proposer, *_ in chains} == {"draft"}
    draft_checks = [t for t in metrics.tiers if t.drafter == "draft"]
    assert sum(t.proposed for t in draft_checks) == sum(t.checks * 2 for t in draft_checks)  # (gamma1 2: whole)
    assert all(False not in went_on[:-1] and 1 <= len(went_on) <= 2 for _, went_on, _ in chains)
    assert any(not went_on[-1] for _, went_on, _ in chains) and any(True in went_on for _, went_on, _ in chains)
    goes_on, sure, unsure = (planner.acceptance[name] for name in stop_names("draft"))
    assert goes_on.trials == pytest.approx(sum(len(w) for _, w, _ in chains))
    tried = [(was_sure, i < accepted) for _, went_on, accepted in chains for i, was_sure in enumerate(went_on[:accepted + 1])]
    for estimate, kind in ((sure, True), (unsure, False)):
        assert estimate.trials == pytest.approx(sum(k == kind for k, _ in tried))
        assert estimate.successes == pytest.approx(sum(k == kind and ok for k, ok in tried))
    assert metrics.auto and tokens


def test_cost_table_measures_once_per_machine_model_and_context(models, tmp_path, monkeypatch):
    from triforce.coordinator.verifier import LocalVerifier

    target, _ = models
    verifier = LocalVerifier(target, 400)
    verifier.prefill(list(range(VOCAB)) * 25)  # 200 tokens
    path = tmp_path / "costs-3.json"
    table = CostTable(path)
    first = table.seconds(verifier, (1, 3))
    assert set(first) == {1, 3} and all(s > 0 for s in first.values()) and verifier.length == 200
    assert path.is_file()

    def no_measuring(tiers, sizes):
        raise AssertionError("measured again")

    monkeypatch.setattr(costs_module, "forward_seconds", no_measuring)
    assert CostTable(path).seconds(verifier, (1, 3)) == first  # another process on this machine reuses it
    verifier.prefill([1] * 20)  # 10% more context: the same entry
    assert CostTable(path).seconds(verifier, (1, 3)) == first
    verifier.prefill([1] * 100)  # 60% more: measured anew
    with pytest.raises(AssertionError, match="measured again"):
        CostTable(path).seconds(verifier, (1,))


@pytest.mark.parametrize("policy,full_layers", [("static", 0), ("static", 1), ("dynamic", 0)])
def test_an_idle_retrieval_tier_is_kept_at_the_context_it_runs_at(models, prompt, tmp_path, monkeypatch, policy,
                                                                  full_layers):
    """An idle retrieval cache holds nothing until it is synced (for its measurement, or when a plan takes
    it): its cost is kept at the context it reads once synced, so the entry is found before and after the
    sync. Keyed at 0, a machine's first auto request measured the tier again at its next plan, in the
    middle of decoding, and the planner's check for known costs missed it. A static cache's context is
    the mean of what its layers read: the budget, the whole context in its full layers."""
    target, draft = models
    settings = {**SETTINGS, "full_layers": full_layers}
    engine = build_engine(EngineConfig(mode="retrieval", retrieval_policy=policy, **settings), target, draft, 128)
    retrieval, verifier = engine.tiers
    verifier.prefill(prompt)
    # 3 layers, 80 tokens, a budget of 12; one full layer: (80 + 2 x 12) / 3
    synced = {("static", 0): 12, ("static", 1): 34, ("dynamic", 0): 80}[policy, full_layers]
    assert retrieval.length == 0 and costs_module.cost_context(retrieval) == synced
    table = CostTable(tmp_path / "costs-3.json")
    first = table.seconds(retrieval, (1, 3), retrieval.sync)
    assert retrieval.length == len(prompt) and costs_module.cost_context(retrieval) == synced
    assert table.known(retrieval, (1, 3))
    monkeypatch.setattr(costs_module, "forward_seconds", lambda tiers, sizes: pytest.fail("measured again"))
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
    CostTable(tmp_path / "costs-3.json").seconds(tier, (1,))
    measured = [call[0][0] for call in starts if call[0][2] == "all"]
    assert measured == [18, 18] and tier.length == 0 and costs_module.cost_context(tier) == 18


def test_on_a_gpu_a_cost_is_timed_on_replays_after_the_queued_work(models, prompt, monkeypatch):
    """On a GPU a size's first CAPTURE_AT forwards run before its CUDA graph is captured (and capture it):
    the two timed were those, not the replays requests run (22 ms against 5.6 on an H200), and no clock
    waited for the GPU, so the filling forwards' queued work fell in the first. (A CPU's device faked.)"""
    import triforce.coordinator.tiers as tiers_module
    from triforce.coordinator.verifier import LocalVerifier
    from triforce.models.cuda_graphs import CAPTURE_AT

    target, _ = models
    verifier = LocalVerifier(target, 128)
    verifier.prefill(prompt)
    events, forward_together = [], costs_module.forward_together
    monkeypatch.setattr(type(target), "device", property(lambda self: torch.device("cuda")))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append("sync"))
    monkeypatch.setattr(costs_module, "forward_together", lambda tiers, steps, logits_for: events.append(
        "forward") or forward_together(tiers, steps, logits_for))
    monkeypatch.setattr(tiers_module.Tier, "forward_many", staticmethod(
        lambda tiers, steps, logits_for: [torch.zeros(s.n, VOCAB) for s in steps]))
    costs_module.forward_seconds([verifier], (3,))
    assert events == ["sync", "forward"] * (CAPTURE_AT + 2)


def test_a_costs_sizes_are_timed_in_rounds_and_a_busy_spell_is_left_out(models, prompt, monkeypatch):
    """The sizes a measurement asks for are timed in rounds, each a forward of every size in turn, and each
    size keeps its fastest: a busy spell of the machine (here: the second round's first two forwards, and
    the first round's last) slows some forwards of each size but not all. Timed one size after another, a
    spell priced the sizes it fell on against the others."""
    from triforce.coordinator.verifier import LocalVerifier

    target, _ = models
    verifier = LocalVerifier(target, 128)
    verifier.prefill(prompt)
    sizes, forward_together = [], costs_module.forward_together
    monkeypatch.setattr(costs_module, "forward_together", lambda tiers, steps, logits_for: sizes.append(
        steps[0].n) or forward_together(tiers, steps, logits_for))
    clock = iter(range(100))
    busy = {(0, 3), (1, 1), (1, 2)}  # (round, size): the spell's forwards take 10 s, the others n s
    timed = iter([(r, n) for r in range(costs_module.ROUNDS) for n in (1, 2, 3)])
    now = [0.0]

    def perf_counter():  # costs.py's clock, read at each timed forward's start and end
        if next(clock) % 2 == 1:
            r, n = next(timed)
            now[0] += 10.0 if (r, n) in busy else float(n)
        return now[0]

    monkeypatch.setattr(costs_module, "time", SimpleNamespace(perf_counter=perf_counter))
    assert costs_module.forward_seconds([verifier], (1, 2, 3)) == {1: 1.0, 2: 2.0, 3: 3.0}
    assert sizes == [1, 2, 3] * costs_module.ROUNDS and verifier.length == len(prompt)


def test_a_size_costs_at_most_what_a_larger_one_was_measured_at():
    """A forward of more tokens does the same work and more, and timings err long: where a larger size ran
    faster, it bounds the smaller ones."""
    assert costs_module.monotone({1: 0.1, 2: 0.3, 3: 0.4, 4: 0.25, 6: 0.5}) == {1: 0.1, 2: 0.25, 3: 0.25, 4: 0.25,
                                                                                  6: 0.5}
    assert costs_module.monotone({4: 0.2, 1: 0.1}) == {4: 0.2, 1: 0.1}


def test_a_cost_measurement_that_fails_leaves_the_cache_as_it_was(models, prompt, monkeypatch):
    """A forward that fails in a cost measurement (out of memory, say) leaves the cache as it found it: a
    batch's leader measures its batchmates' tiers, and since a run's error ends that run alone, they run on."""
    from triforce.coordinator.verifier import LocalVerifier

    target, _ = models
    verifier = LocalVerifier(target, 128)
    verifier.prefill(prompt)
    before = [k.clone() for k in verifier.cache.last_query]
    forward_together = costs_module.forward_together
    calls = []

    def failing_second(tiers, steps, logits_for):
        calls.append(1)
        out = forward_together(tiers, steps, logits_for)
        if len(calls) == 2:
            raise RuntimeError("out of memory")
        return out

    monkeypatch.setattr(costs_module, "forward_together", failing_second)
    with pytest.raises(RuntimeError, match="out of memory"):
        costs_module.forward_seconds([verifier], (3,))
    assert verifier.length == len(prompt) and verifier.cache.length == len(prompt)
    assert all(torch.equal(a, b) for a, b in zip(verifier.cache.last_query, before))


def test_a_batch_is_measured_as_one_call_of_all_its_sequences(models, tmp_path, monkeypatch):
    """A batch's cost: one call of every sequence's tier (each over its own cache), keyed by the batch
    size, every cache as it was after."""
    from triforce.coordinator.verifier import LocalVerifier

    target, _ = models
    verifiers = [LocalVerifier(target, 400) for _ in range(4)]
    for i, v in enumerate(verifiers):
        v.prefill(list(range(VOCAB)) * (25 + i))
    spent = [v.seconds for v in verifiers]
    table = CostTable(tmp_path / "costs-3.json")
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
    # both drafts (auto_self_draft: the target's own weights as a second draft tier), swapped between rounds
    "two-drafts": [(("draft@self", "target"), (2,)), (("draft", "retrieval", "target"), (2, 2)),
                   (("draft@self", "retrieval@24", "target"), (2, 3)), (("target",), ()), (("draft", "target"), (3,))],
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
    times.observe_overhead = lambda running, name, role, seconds, rows, r: \
        seen.append((name, role, seconds, rows, running)) or observe_overhead(running, name, role, seconds, rows, r)
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
    assert all(running == planner.running or running in STACK_MODES.values() for *_, running in seen)
    assert set(times.overhead) == {f"{name}/{role}" for name, role, *_ in seen} | \
        {f"{running}:{name}/{role}" for name, role, _, _, running in seen}  # any mode's, and each mode's own


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


def test_the_users_gammas_past_the_planners_range_fit_every_cache(models, prompt):
    """Mode auto runs the user's gamma1 and gamma2 (the gammas it prefers) even past the MAX_GAMMA it
    searches: every cache has room for their chains (it had for MAX_GAMMA's only: a retrieval tier asked
    to hold 16 + 16 speculative tokens failed the request)."""
    target, draft = models
    params = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
    reference, _ = build_engine(EngineConfig(mode="ar", **SETTINGS), target, None, 140).generate(prompt, params)
    engine = build_engine(EngineConfig(mode="auto", gamma1=16, gamma2=16, **SETTINGS), target, draft, 140)
    engine = follow_script(engine, SETTINGS["budget"], [(("draft", "retrieval", "target"), (16, 16))])
    tokens, metrics = engine.generate(prompt, params)
    assert tokens == reference
    assert max(t.proposed / t.checks for t in metrics.tiers if t.checks) >= 16  # chains that long ran


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
    cache = FullKVCache(target.config, len(prompt) + 2, target.dtype, "cpu")
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
    assert (calibration / "costs-3.json").is_file()
    assert "auto" in metrics.to_dict()


def test_a_rows_processing_is_timed_again_on_a_models_row(models, prompt, calibration, monkeypatch):
    """The request's row processing, timed on random logits at the first plan (no forward has given a row
    yet), is timed again on the first row the target gives, once: top-p ranks a model's few likely tokens and
    sorts a random row's whole vocabulary (speculation/sampling.top_p_dropped), so random rows priced a
    request's rows many times what they cost."""
    target, draft = models
    timed = []

    def recorded(probs, vocab, sample=None, rows=8):
        timed.append(sample)
        return 1e-4 if sample is None else 2e-5

    monkeypatch.setattr(auto, "row_seconds", recorded)
    engine = build_engine(EngineConfig(mode="auto", **SETTINGS), target, draft, 128)
    engine.generate(prompt, SamplingParams(max_tokens=48, temperature=0.6, top_p=0.9, seed=1, ignore_eos=True))
    assert len(timed) == 2 and timed[0] is None and tuple(timed[1].shape) == (1, VOCAB)
    assert engine.planner.row_seconds == 2e-5


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
    short, = handles[1].result[1].auto  # 20 tokens: plain decoding, no plan, never the leader
    assert short["mode"] == "ar" and short["why"] == {"max_tokens_below": auto.MIN_PLANNED_TOKENS}
    assert all(p[0]["why"]["batch"] == 2 for p in plans)
    assert (plans[0][0]["mode"], plans[0][0]["gammas"]) == (plans[1][0]["mode"], plans[1][0]["gammas"])
    assert plans[1][0].get("from") == "the batch's leader"
    assert led and not any(led)  # it led once the first had ended (120 tokens after it: 13 rounds or more)
    costs = CostTable(calibration / "costs-3.json").entries
    assert any("|batch=2||" in key for key in costs)


def test_short_requests_decode_plainly_without_measuring(models, prompt, calibration):
    """...and their metrics say so, as a plan's record (they held none: the choice and why were missing)."""
    target, draft = models
    engine = build_engine(EngineConfig(mode="auto", **SETTINGS), target, draft, 100)
    tokens, metrics = engine.generate(prompt, SamplingParams(max_tokens=auto.MIN_PLANNED_TOKENS - 1, ignore_eos=True))
    assert len(tokens) == auto.MIN_PLANNED_TOKENS - 1 and metrics.tiers == []
    (record,) = metrics.auto
    assert (record["mode"], record["gammas"], record["at_token"], record["context"]) == ("ar", [], 0, len(prompt))
    assert record["why"] == {"max_tokens_below": auto.MIN_PLANNED_TOKENS}
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
    second.planner.fade = lambda generated: fades.append((second.rounds, first.prefilled)) or fade(generated)
    learned_following, observe_cost = [], second.planner.times.observe_cost  # (a follower's forwards scaled
    # its own last plan's costs, a lone request's, by the leader's batch's calls)

    def watched(*args):
        before = dict(second.planner.times.scale)
        observe_cost(*args)
        if mates.leader() is not second and second.planner.times.scale != before:
            learned_following.append(args)

    second.planner.times.observe_cost = watched
    batch = SequenceBatch()
    batch.add(first.run(long_prompt, params))
    batch.add(second.run(short_prompt, params))
    batch.run()
    assert any(busy_plans)  # it led while the first prefilled, planning with the chunks' cost
    assert not learned_following
    after = [rounds for rounds, prefilled in fades if prefilled]
    assert after and len(after) <= (after[-1] - after[0]) // auto.REPLAN_ROUNDS + 2


def test_greedy_equals_plain_decoding_while_plans_swap_the_draft_for_the_target_itself(models, prompt,
                                                                                      replan_every_round):
    """auto_self_draft: a second draft tier, "draft@self", runs the target's weights over a streaming window
    (64 tokens, short of the 80-token prompt: it parts from the target at times); plans that swap it for the
    draft model's tier, above and beside the retrieval tier, keep greedy output equal to plain decoding."""
    target, _ = models
    params = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
    reference, _ = build_engine(EngineConfig(mode="ar", **SETTINGS), target, None, 140).generate(prompt, params)
    engine = scripted_engine(models, prompt, 60, "two-drafts", auto_self_draft=True)
    assert engine.planner.tiers["draft@self"].model is target
    tokens, metrics = engine.generate(prompt, params)
    assert tokens == reference
    checked = {(t.drafter, t.name): t for t in metrics.tiers if t.checks}
    assert {("draft@self", "target"), ("draft@self", "retrieval@24"), ("draft", "retrieval"),
            ("draft", "target")} <= set(checked)
    self_checks = [checked["draft@self", "target"], checked["draft@self", "retrieval@24"]]
    assert 0 < sum(t.accepted for t in self_checks) < sum(t.proposed for t in self_checks)
    assert {d["mode"] for d in metrics.auto} >= {"draft@self", "triforce@self@24"}


def test_every_idle_draft_is_watched(models, monkeypatch):
    """With both drafts held and neither running, each that the plan would watch (by default every one; a
    planner's plans name those predicted to gain) catches up at every re-plan and reports how its proposals
    would have fared, over the same generated tokens."""
    monkeypatch.setattr(auto, "REPLAN_ROUNDS", 4)
    monkeypatch.setattr(auto, "MIN_PLANNED_TOKENS", 1)
    prompt = torch.randint(0, VOCAB, (20,), generator=torch.Generator().manual_seed(5)).tolist()
    for watch in (None, ("draft@self",)):  # every idle draft; only the one a plan predicts to gain
        engine = scripted_engine(models, prompt, 40, "ar-only", auto_self_draft=True)
        engine.planner.watch, seen = watch, []
        engine.planner.observe_idle = lambda name, accepted, tokens: seen.append((name, tokens))
        engine.generate(prompt, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
        for name in watch or ("draft", "draft@self"):
            assert [tokens for who, tokens in seen if who == name] == [3] + [4] * 9, name
        assert {who for who, _ in seen} == set(watch or ("draft", "draft@self"))


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


@pytest.mark.parametrize("upside,watches", [(1.0, []), (1.0001, [3])])
@pytest.mark.parametrize("script", ["ar-only", "ar-first"])
def test_an_idle_draft_goes_unwatched_where_it_could_not_gain_what_watching_costs(models, script, upside, watches,
                                                                                 monkeypatch):
    """With no predicted gain from the draft (upside 1) it is never watched; with a gain too small to pay
    for watching, the first watch measures what watching costs and none follows. Where a plan then takes
    the draft, it catches up on every token it skipped, exactly."""
    monkeypatch.setattr(auto, "REPLAN_ROUNDS", 4)
    monkeypatch.setattr(auto, "MIN_PLANNED_TOKENS", 1)
    target, _ = models
    prompt = torch.randint(0, VOCAB, (20,), generator=torch.Generator().manual_seed(5)).tolist()
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    reference, _ = build_engine(EngineConfig(mode="ar", **SETTINGS), target, None, 60).generate(prompt, params)
    engine = scripted_engine(models, prompt, 40, script)
    engine.planner.draft_upside = upside
    seen = []
    engine.planner.observe_idle = lambda name, accepted, tokens: seen.append(tokens)
    tokens, _ = engine.generate(prompt, params)
    assert tokens == reference  # ar-first: the draft joins after idle stretches it did not watch
    assert seen == watches  # the first watch at round 4 under ar (3 tokens generated); none after it
    assert engine._watch_seconds > 0 if watches else engine._watch_seconds is None


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
        cache = FullKVCache(model.config, len(sequence), model.dtype, "cpu")
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


def test_a_batchmate_catching_up_its_draft_is_not_measured_with(models, calibration):
    """A batch cost runs filler over the batchmates' caches and rolls it back: a member whose draft skipped
    to a long prompt's last window and has not fed it yet (its cache is not settled) cannot roll back
    there (a ValueError that failed the whole generate call, when the first request planned between a
    batchmate's skip and its window's forward), so it is not measured with; once fed, it is."""
    from types import SimpleNamespace

    from triforce.cache.streaming import StreamingKVCache

    _, draft = models
    cache = StreamingKVCache(draft.config, 2, 16, 4, draft.rope, draft.dtype, draft.device)
    member = lambda: SimpleNamespace(planner=SimpleNamespace(tiers={"draft": SimpleNamespace(cache=cache),  # noqa: E731
                                                                    "target": SimpleNamespace(cache=None)}),
                                     plans=True, rounds=0)
    me, mate = member(), member()
    mates = Batchmates([me, mate])

    def feed(n):
        cfg = draft.config
        cache.begin(Step.chain([1] * n, cache.length))
        for layer in range(cfg.num_layers):
            kv = torch.zeros(cfg.num_kv_heads, n, cfg.head_dim)
            cache.append(layer, torch.zeros(cfg.num_heads, n, cfg.head_dim), kv, kv)
        cache.end()

    feed(2)  # the sinks
    cache.skip(40)
    assert not cache.settled and mates.measurable(me.planner) == []
    feed(16)  # the window skipped to
    assert cache.settled and mates.measurable(me.planner) == [mate]

def test_a_plan_adopted_frees_every_idle_retrieval_tier_of_the_request():
    """A batch's leader running `retrieval` measures its batchmates' retrieval tiers with its own (synced:
    built) and keeps them while it runs that tier; a batchmate that then adopts a plan without it freed
    only the tiers it had run itself, so its built cache stayed allocated beyond what memory admission
    counts for it."""
    from types import SimpleNamespace

    from triforce.coordinator.auto import AutoEngine
    from triforce.coordinator.speed_model import Plan

    released = []

    class Idle:
        def __init__(self, name):
            self.name = name

        def release(self):
            released.append(self.name)

    tiers = {name: Idle(name) for name in ("draft", "retrieval@12", "target")}
    planner = SimpleNamespace(tiers=tiers, decisions=[], begin_stretch=lambda: None)
    mate = AutoEngine(list(tiers.values()), planner)
    assert mate.tiers == [tiers["target"]]  # it has not run a round: measured with the leader's
    plan = Plan(("target",), (), 1.0)
    list(mate._adopt(plan, 0))
    assert "retrieval@12" in released and "target" not in released


def test_beside_batchmates_a_request_measures_its_own_time_between_forwards(models, tiny_dir, calibration,
                                                                            monkeypatch):
    """The overhead between a request's forwards (its sampling, verification and bookkeeping) is each
    sequence's own: a batch pays it per member (forward_times.py). Beside batchmates the wall time between
    its forwards holds theirs, so it had gone unmeasured, and the model priced a batch with none
    (`triforce` at batch 8 and 0.6 on the AMX Xeon spent 2.67 s of a 15 s decode there). It is the run's own
    time now (runs.OwnTime): with every model call made to take 60 ms, and one request's target another
    copy of the weights (so its target forwards are calls of their own, which the others' wait through),
    what each request measured is still its own few milliseconds. (The delay sits inside the model call,
    which its tiers are charged for: around it, a request that ran alone at the end measured it on the
    wall clock as overhead, 60 ms, and failed this test when the load left it alone for a few rounds.)"""
    from triforce.coordinator.batch import SequenceBatch

    target, draft = models
    model_class = type(target)
    forward_batch = model_class.forward_batch

    def slow(self, *args, **kwargs):
        end = time.perf_counter() + 0.06
        while time.perf_counter() < end:
            pass
        return forward_batch(self, *args, **kwargs)

    monkeypatch.setattr(model_class, "forward_batch", slow)
    g = torch.Generator().manual_seed(12)
    prompts = [torch.randint(0, VOCAB, (80,), generator=g).tolist() for _ in range(3)]
    params = SamplingParams(max_tokens=40, temperature=0.7, seed=3, ignore_eos=True)
    mates = Batchmates()
    copy = load_model(tiny_dir("auto-target", seed=40, num_layers=3, vocab_size=VOCAB, hidden_size=64,
                               num_heads=4, num_kv_heads=2, scale=4))
    engines = [build_engine(EngineConfig(mode="auto", **SETTINGS), model, draft, 200, batchmates=mates)
               for model in (target, target, copy)]
    batch = SequenceBatch()
    handles = [batch.add(e.run(p, params)) for e, p in zip(engines, prompts)]
    batch.run()
    assert all(len(h.result[0]) == 40 for h in handles)
    for engine in engines:
        overhead = engine.planner.times.overhead
        # (past the rows' processing, timed apart: on a loaded machine it may take all of it; the suite's
        # two workers once made an `ar` stretch's own time 10.8 ms, so the calls take 60 ms and the bound is
        # half)
        assert overhead and all(0 <= seconds < 0.03 for seconds in overhead.values()), overhead
