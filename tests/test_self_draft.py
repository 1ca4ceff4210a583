"""`--draft self`: the target's own weights over the draft tier's streaming cache (llm_models.SELF_DRAFT).

Greedy output equals `ar` token for token in every mode that runs a draft (float32), with the streaming
window short of the prompt, so the draft tier sees less than the target and some of its proposals are
rejected; with a window that holds the whole prompt the draft *is* the target and every proposal is
accepted. No second copy of the weights: the draft is the target's model object, and one int8 twin serves
both proposing tiers. The sampled first token of `triforce` with this draft is tested by chi-square in
tests/coordinator/test_selection_sampling.py."""
import pytest

from triforce import LLM, SamplingParams
from triforce.config import ConfigError, EngineConfig

PROMPT = " ".join(f"w{i % 37}" for i in range(150))
DRAFT_TIER = dict(window=32, sinks=4, lookup=0)  # (the prompt lookup's copies of the text may be rejected too)
TIERS = dict(DRAFT_TIER, budget=32, chunk_size=4, full_layers=0, refresh_every=16)


@pytest.fixture(scope="module")
def target(tiny_dir):
    return tiny_dir("self-draft-target", tokenizer=True, seed=61, num_layers=2, vocab_size=96)


@pytest.fixture(scope="module")
def plain(target):
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    return LLM(target, mode="ar", dtype="float32").generate(PROMPT, params, use_tqdm=False)[0].token_ids


@pytest.mark.parametrize("mode", ["draft", "triforce", "auto"])
def test_greedy_output_with_the_target_as_its_own_draft_equals_plain_decoding(target, plain, mode):
    llm = LLM(target, "self", mode=mode, dtype="float32", **(DRAFT_TIER if mode == "draft" else TIERS))
    assert llm.draft is llm.target and llm.draft_name == "self"
    out = llm.generate(PROMPT, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True), use_tqdm=False)[0]
    assert out.token_ids == plain
    if mode != "auto":  # (auto may plan without the draft tier)
        checked = {tier.name: tier for tier in out.metrics.tiers}["retrieval" if mode == "triforce" else "target"]
        assert checked.drafter == "draft" and checked.proposed > 0
        assert checked.accepted < checked.proposed, "a window short of the prompt should part from the target"


def test_a_window_that_holds_the_whole_context_makes_every_proposal_right(target, plain):
    llm = LLM(target, "self", mode="draft", dtype="float32", **{**DRAFT_TIER, "window": 200})
    out = llm.generate(PROMPT, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True), use_tqdm=False)[0]
    assert out.token_ids == plain
    tier = out.metrics.tiers[0]
    assert tier.proposed > 0 and tier.accepted == tier.proposed


def test_both_proposing_tiers_share_one_int8_twin_of_the_target(target, int8_kernels):
    llm = LLM(target, "self", mode="triforce", dtype="float32", retrieval_weights="int8", draft_weights="int8",
              **TIERS)
    assert llm.draft_model is llm.retrieval_model and llm.draft_model.quantized == "int8"
    assert llm.draft_model.twin_of is llm.target
    assert llm.draft_model not in llm.target.modules()  # (the twin is not a submodule of the target, nor back)
    assert llm.target not in llm.draft_model.modules()


def test_the_draft_self_takes_no_revision_and_no_mode_without_a_draft(target):
    with pytest.raises(ConfigError, match="the target's own weights"):
        LLM(target, "self", mode="triforce", dtype="float32", draft_revision="main")
    with pytest.raises(ConfigError, match="draft"):
        LLM(target, "self", mode="ar", dtype="float32")


def test_a_target_without_a_draft_is_pointed_to_the_draft_self(target, capsys):
    with pytest.raises(ConfigError, match="--draft self"):
        LLM(target, mode="draft", dtype="float32")
    assert LLM(target, mode="triforce", dtype="float32").config.mode == "retrieval"
    assert "`--draft self` would draft with the target's own weights" in capsys.readouterr().err


def test_mode_auto_holds_the_target_as_a_second_draft_where_asked(target, plain):
    """auto_self_draft: mode auto holds the self draft as a tier of its own ("draft@self"), scored with the
    others at its first plan (here beside no draft model: this target has none), and greedy output still
    equals plain decoding."""
    llm = LLM(target, mode="auto", dtype="float32", auto_self_draft=True, **TIERS)
    assert llm.draft is None
    out = llm.generate(PROMPT, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True), use_tqdm=False)[0]
    assert out.token_ids == plain
    assert {"draft@self", "triforce@self"} <= set(out.metrics.auto[0]["why"]["expected_tokens_per_s"])


def test_the_second_draft_is_refused_where_it_would_go_unused(target):
    with pytest.raises(ConfigError, match="the target already"):
        LLM(target, "self", mode="auto", dtype="float32", auto_self_draft=True)
    with pytest.raises(ConfigError, match="mode triforce does not choose"):
        LLM(target, "self", mode="triforce", dtype="float32", auto_self_draft=True)
    with pytest.raises(ConfigError, match="True or False"):
        EngineConfig(auto_self_draft="yes")
