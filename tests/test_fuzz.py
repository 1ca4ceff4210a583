"""A few cases of the fuzzers (random configurations of every mode, tree, batch and request setting, in
float32 and bfloat16): benchmarks/exactness_fuzz.py on the engine, benchmarks/api_fuzz.py through
LLM.generate: greedy requests equal plain decoding, alone and in their batch; seeded samples are the same
alone and in the batch. benchmarks/distribution_fuzz.py: a sampled request's first tokens follow plain
decoding's distribution (chi-square, against the exact one in float32), and the test finds a draw that does not. The
scripts run many more (`--cases 2000`)."""
import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SEED, CASES, GROUPS = 0, 32, 4  # the engine's cases, run in GROUPS tests
API_CASES = 10
DISTRIBUTION_CASE, DISTRIBUTION_RUNS = 6, 400  # triforce with chains, min_tokens, 3 tokens at temperature 1


def script(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # (api_fuzz imports exactness_fuzz by name)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory):
    """The engine fuzzer and the api one, and their models (with tokenizers, which the engine's cases ignore)."""
    engine, api = script("exactness_fuzz"), script("api_fuzz")
    return engine, api, api.write_text_pairs(tmp_path_factory.mktemp("fuzz"))


@pytest.mark.parametrize("group", range(GROUPS))
def test_random_configurations_are_exact(fuzz, group, tmp_path):
    module, _, folders = fuzz
    models, seen = module.Models(folders), {}
    for index in range(group, CASES, GROUPS):
        case = module.draw_case(SEED, index)
        tiers = module.tiers_for(case, models)
        if tiers is None:
            continue  # an int8 twin refused here (no CPU kernels)
        with module.case_environment(tmp_path / str(index), module.replanning(case)):
            assert module.check_case(case, tiers, seen) == [], (index, case["settings"])
    accepted = sum(a for a, _ in seen.values())
    proposed = sum(p for _, p in seen.values())
    assert 0 < accepted < proposed  # the tiers agreed on some proposals and not on others


def test_random_requests_through_llm_generate_are_exact(fuzz, tmp_path):
    engine_fuzz, api, folders = fuzz
    for index in range(API_CASES):
        case = api.draw_case(SEED, index)
        with engine_fuzz.case_environment(tmp_path / str(index)):
            assert api.check_case(case, folders) == [], (index, case)


@pytest.fixture(scope="module")
def distribution(fuzz, tmp_path_factory):
    """The distribution fuzzer (after the engine's, which it imports), its models and its case."""
    module = script("distribution_fuzz")
    case = module.draw_case(SEED, DISTRIBUTION_CASE)
    models = fuzz[0].Models(module.write_small_pairs(tmp_path_factory.mktemp("distribution")))
    return module, case, fuzz[0].tiers_for(case, models)


def test_a_random_configurations_samples_follow_plain_decodings(fuzz, distribution, tmp_path):
    engine_fuzz, (module, case, tiers), seen = fuzz[0], distribution, {}
    with engine_fuzz.case_environment(tmp_path, engine_fuzz.replanning(case)):
        assert module.check_case(case, tiers, DISTRIBUTION_RUNS, seen)["failures"] == []
    assert set(seen) == {"retrieval", "target"}
    assert all(0 < accepted < proposed for accepted, proposed in seen.values())


def test_the_distribution_fuzzer_finds_a_draw_that_parts_from_the_target(fuzz, distribution, tmp_path, monkeypatch):
    """Its test has the power to fail: the target's recovered and bonus tokens taken greedily (the argmax
    of their distribution) fail it (p 3e-14 on the first pair here, where the code as it is gave 0.98)."""
    import triforce.speculation.verify as verify

    engine_fuzz, (module, case, tiers) = fuzz[0], distribution
    real_sample = verify.sample
    monkeypatch.setattr(verify, "sample", lambda probs, generator, greedy, proposal=False:
                        real_sample(probs, generator, True, proposal))
    with engine_fuzz.case_environment(tmp_path, engine_fuzz.replanning(case)):
        p_values = module.p_values(case, tiers, DISTRIBUTION_RUNS, 0)
    assert min(p_values) * len(p_values) < module.ALPHA


def test_the_exact_test_fails_an_outcome_plain_sampling_rules_out_pools_rare_ones_and_conditions(distribution):
    from collections import Counter

    module = distribution[0]
    exact = {(1, 2): 0.49, (1, 3): 0.49, (5, None): 0.02}  # (5, None) expected 2 times in 100: pooled
    assert module.fit_p(Counter({(1, 2): 49, (1, 3): 49, (5, None): 2}), exact) > 0.9
    assert module.fit_p(Counter({(1, 2): 49, (1, 3): 50, (4, 4): 1}), exact) == 0.0
    assert module.fit_p(Counter({(1, 2): 80, (1, 3): 18, (5, None): 2}), exact) < 1e-6
    triples = {(1, t2, t3): 0.25 for t2 in (2, 5) for t3 in (3, 4)}  # the third token given the pair: 1/2 each
    skewed_pairs = Counter({(1, 2, 3): 60, (1, 2, 4): 60, (1, 5, 3): 20, (1, 5, 4): 20})
    assert module.fit_p(skewed_pairs, triples, given=2) > 0.9
    assert module.fit_p(skewed_pairs, triples) < 1e-6
