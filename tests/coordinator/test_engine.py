"""Lossless: every mode reproduces plain decoding (greedy, float32) and the target's distribution
(sampling, chi-square at alpha = 1e-3) on tiny random checkpoints."""
import dataclasses
import itertools

import pytest
import torch
from scipy.stats import chisquare

from checkpoints import CHARS, write_char_tokenizer, write_reduced_vocabulary
from penalty_reference import reference_penalized
from sampling_runs import outputs
from scripted_planner import follow_script
from triforce.cache.full import FullKVCache
from triforce.cache.retrieval import RetrievalKVCache
from triforce.config import DEFAULT_LOOKUP, ConfigError, EngineConfig
from triforce.sampling_params import SamplingParams, StructuredOutputs
from triforce.coordinator import engine as engine_module
from triforce.coordinator.engine import HierarchyEngine
from triforce.coordinator.hierarchy import build_engine
from triforce.coordinator.tiers import Tier
from triforce.coordinator.verifier import LocalVerifier
from triforce.models.loader import load_model
from triforce.models.quantized import int8_twin
from triforce.speculation.guided import Grammars
from triforce.speculation.rules import RulesContradict
from triforce.speculation.sampling import probabilities, top_probability
from triforce.step import Step

ALPHA = 1e-3
SETTINGS = dict(budget=32, chunk_size=4, sinks=2, window=16, refresh_every=12, full_layers=1)
MODES = [("draft", "static"), ("retrieval", "static"), ("retrieval", "dynamic"), ("triforce", "static"),
         ("triforce", "dynamic")]


@pytest.fixture(scope="module")
def models(tiny_dir):
    target = load_model(tiny_dir("engine-target", seed=11, num_layers=3, scale=25))
    draft = load_model(tiny_dir("engine-draft", seed=12, num_layers=1, scale=25))
    return target, draft


# Mode auto's plans in exactness tests: fixed, so that each test sees its drafted stacks whatever the
# machine measures (a tiny model's forwards can make plain decoding look best on a busy machine).
AUTO_SCRIPT = [(("draft", "target"), (4,)), (("target",), ()), (("draft", "retrieval", "target"), (2, 4)),
               (("retrieval", "target"), (3,))]


EOS = 2  # the tiny checkpoints' end-of-sequence id


def run(target, draft, mode, prompt, params, policy="static", guide=None, **overrides):
    """guide: a structured-output constraint's Guide (end-of-sequence then ends the request)."""
    cfg = EngineConfig(mode=mode, retrieval_policy=policy, **{**SETTINGS, **overrides})
    engine = build_engine(cfg, target, draft, len(prompt) + params.max_tokens)
    if mode == "auto":
        follow_script(engine, cfg.budget, AUTO_SCRIPT)
    return engine.generate(prompt, params, (EOS,) if guide is not None else (), guide=guide)


def test_greedy_with_a_reduced_vocabulary_draft_equals_plain_decoding(tiny_dir, models):
    target, _ = models
    kept = list(range(3, 96, 2))  # half the target's tokens
    folder = tiny_dir("engine-draft-reduced", seed=12, num_layers=1, scale=25, vocab_size=len(kept) + 1)
    draft = load_model(write_reduced_vocabulary(folder, kept, 96))
    prompt = torch.randint(3, 96, (120,), generator=torch.Generator().manual_seed(6)).tolist()
    params = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
    reference, _ = run(target, None, "ar", prompt, params)
    for mode in ("draft", "triforce"):
        assert run(target, draft, mode, prompt, params)[0] == reference


@pytest.mark.parametrize("mode,policy", MODES)
@pytest.mark.parametrize("gammas", [(2, 6), (1, 1), (4, 3)])
def test_greedy_equals_plain_decoding(models, mode, policy, gammas):
    target, draft = models
    prompt = torch.randint(3, 96, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    params = SamplingParams(max_tokens=80, temperature=0, ignore_eos=True)
    reference, _ = run(target, draft, "ar", prompt, params)
    tokens, metrics = run(target, draft, mode, prompt, params, policy, gamma1=gammas[0], gamma2=gammas[1])
    assert tokens == reference
    assert metrics.generated_tokens == 80 and all(t.proposed > 0 for t in metrics.tiers)


@pytest.mark.parametrize("mode,policy,twins", [("retrieval", "static", ("retrieval",)),
                                               ("retrieval", "dynamic", ("retrieval",)),
                                               ("triforce", "static", ("retrieval", "draft")),
                                               ("draft", "static", ("draft",)), ("auto", "static", ("retrieval", "draft"))])
def test_greedy_with_int8_proposers_equals_plain_decoding(models, mode, policy, twins, int8_kernels):
    """The retrieval tier on the target's int8 twin and the draft tier on the draft's (models/quantized.py)
    propose otherwise than on their own weights, and the output is still plain decoding's."""
    target, draft = models
    retrieval_model = int8_twin(target) if "retrieval" in twins else None
    draft_model = int8_twin(draft, "draft") if "draft" in twins else draft
    prompt = torch.randint(3, 96, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    params = SamplingParams(max_tokens=80, temperature=0, ignore_eos=True)
    reference, _ = run(target, draft, "ar", prompt, params)
    cfg = EngineConfig(mode=mode, retrieval_policy=policy, **{f"{t}_weights": "int8" for t in twins}, **SETTINGS)
    engine = build_engine(cfg, target, draft_model, len(prompt) + params.max_tokens, retrieval_model=retrieval_model)
    if mode == "auto":
        follow_script(engine, cfg.budget, AUTO_SCRIPT)
    for tier in engine.ladder[:-1]:
        assert tier.model is (draft_model if tier.name == "draft" else retrieval_model)
        assert tier.model.quantized == "int8"
    with pytest.raises(ValueError, match="does not match the model given for that tier"):  # a twin the config
        build_engine(dataclasses.replace(cfg, retrieval_weights="target", draft_weights="draft"), target,  # denies
                     draft_model, len(prompt) + params.max_tokens, retrieval_model=retrieval_model)
    with pytest.raises(ValueError, match="does not match the model given for that tier"):  # and the reverse
        build_engine(cfg, target, draft, len(prompt) + params.max_tokens)
    tokens, metrics = engine.generate(prompt, params)
    assert tokens == reference
    assert all(t.proposed > 0 for t in metrics.tiers)


@pytest.mark.parametrize("mode,policy,sampling,twins", [
    ("triforce", "static", dict(temperature=1.0), ("retrieval", "draft")),
    ("retrieval", "dynamic", dict(temperature=0.8, top_k=5), ("retrieval",))])
def test_int8_proposers_sample_the_target_distribution(small_vocab, mode, policy, sampling, twins, int8_kernels):
    """The two-token chi-square with the retrieval tier (choosing chunks: SELECTING) on the target's int8 twin
    and the draft on its own."""
    draft, _, target = small_vocab
    retrieval_model = int8_twin(target)
    draft_model = int8_twin(draft, "draft") if "draft" in twins else draft
    prompt = [int(t) for t in torch.randint(0, 8, (40,), generator=torch.Generator().manual_seed(4))]
    params = SamplingParams(max_tokens=2, ignore_eos=True, **sampling)
    expected = exact_two_token_distribution(target, prompt, params)
    cfg = EngineConfig(mode=mode, retrieval_policy=policy, gamma1=2, gamma2=3, **SELECTING,
                       **{f"{t}_weights": "int8" for t in twins})

    def run_of(seed):
        engine = build_engine(cfg, target, draft_model, len(prompt) + 2, retrieval_model=retrieval_model)
        return engine.run(prompt, SamplingParams(max_tokens=2, ignore_eos=True, seed=seed, **sampling))

    assert_two_token_distribution(run_of, expected)


@pytest.mark.parametrize("mode,policy", MODES + [("auto", "static")])
def test_greedy_with_a_logit_bias_equals_plain_decoding_with_it(models, mode, policy):
    """A logit bias changes every tier's rows alike: each mode follows `ar` with the same bias, which
    here bans the tokens plain decoding chose most and boosts another."""
    target, draft = models
    prompt = torch.randint(3, 96, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    free, _ = run(target, draft, "ar", prompt, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    banned = sorted(set(free), key=free.count)[-2:]
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True,
                            logit_bias={**{t: -100 for t in banned}, 50: 5.0})
    reference, _ = run(target, draft, "ar", prompt, params)
    assert not set(banned) & set(reference) and reference != free
    tokens, metrics = run(target, draft, mode, prompt, params, policy)
    assert tokens == reference and all(t.checks > 0 for t in metrics.tiers)


PENALTIES = dict(presence_penalty=0.8, frequency_penalty=0.6, repetition_penalty=1.4)


@pytest.mark.parametrize("mode,policy,trees", [(m, p, {}) for m, p in MODES] + [
    ("auto", "static", {}), ("triforce", "static", dict(tree1=8)), ("retrieval", "dynamic", dict(tree2=8)),
    ("draft", "static", dict(tree1=8, tree_shape="confidence"))])
def test_greedy_with_penalties_equals_plain_decoding_with_them(models, mode, policy, trees):
    """Every tier's row is penalized by its own position's history (a chain's earlier proposals, a tree
    node's ancestors): each mode follows `ar` with the same penalties, which change what it says."""
    target, draft = models
    prompt = torch.randint(3, 96, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    free, _ = run(target, draft, "ar", prompt, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, **PENALTIES)
    reference, _ = run(target, draft, "ar", prompt, params)
    assert reference != free
    tokens, metrics = run(target, draft, mode, prompt, params, policy, **trees)
    assert tokens == reference and all(t.checks > 0 for t in metrics.tiers)


def has_sequence(tokens: list[int], sequence: tuple[int, ...]) -> bool:
    return any(tuple(tokens[i:i + len(sequence)]) == sequence for i in range(len(tokens) - len(sequence) + 1))


@pytest.mark.parametrize("mode,policy,trees", [(m, p, {}) for m, p in MODES] + [
    ("auto", "static", {}), ("triforce", "static", dict(tree1=8)), ("retrieval", "dynamic", dict(tree2=8)),
    ("draft", "static", dict(tree1=8, tree_shape="confidence"))])
def test_greedy_with_allowed_tokens_and_bad_words_equals_plain_decoding_with_them(models, mode, policy, trees):
    """allowed_token_ids mask every tier's rows alike; a bad word's last token is banned in each row whose
    own history (a chain's earlier proposals, a tree node's ancestors) ends with its other tokens: each
    mode follows `ar` with both, which never says a bad word and only allowed tokens."""
    target, draft = models
    prompt = torch.randint(3, 96, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    allowed = tuple(range(3, 60))
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, allowed_token_ids=allowed)
    free, _ = run(target, draft, "ar", prompt, params)
    assert set(free) <= set(allowed)
    pair = next((a, b) for a, b in zip(free, free[1:]) if a != b)  # a bigram plain decoding says
    bad = ((max(set(free), key=free.count),), pair, tuple(free[5:8]))
    params = dataclasses.replace(params, bad_words_ids=bad)
    reference, _ = run(target, draft, "ar", prompt, params)
    assert set(reference) <= set(allowed) and reference != free
    assert not any(has_sequence(reference, s) for s in bad)
    tokens, metrics = run(target, draft, mode, prompt, params, policy, **trees)
    assert tokens == reference and all(t.checks > 0 for t in metrics.tiers)


@pytest.mark.parametrize("mode", ["draft", "triforce"])
def test_a_proposer_equal_to_its_checker_is_always_accepted_under_penalties(models, mode):
    """The proposers' rows are penalized, and banned their stop tokens (min_tokens), as the checkers' are
    (greedy equality cannot tell: a proposer's rows never change the output): a draft that is the target,
    its window holding the whole sequence, has every proposal accepted, in chains."""
    target, _ = models
    prompt = torch.randint(3, 96, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    free, _ = run(target, None, "ar", prompt, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True,
                                                             **PENALTIES))
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, stop_token_ids=(free[3],), min_tokens=30,
                            **PENALTIES)
    cfg = EngineConfig(mode=mode, budget=256, chunk_size=4, sinks=2, window=250, full_layers=1)
    _, metrics = build_engine(cfg, target, target, len(prompt) + 40).generate(prompt, params)
    assert all(t.proposed > 0 and t.accepted == t.proposed for t in metrics.tiers)


@pytest.mark.parametrize("mode,policy,trees", [(m, p, {}) for m, p in MODES] + [
    ("auto", "static", {}), ("triforce", "static", dict(tree1=8)), ("retrieval", "dynamic", dict(tree2=8))])
def test_greedy_with_min_tokens_and_stop_token_ids_equals_plain_decoding(models, mode, policy, trees):
    """A stop token id ends generation even with ignore_eos; with min_tokens it is impossible in every
    tier's rows before then (each row by its own length), after which it may end it: each mode follows
    `ar`, which no longer stops where it did."""
    target, draft = models
    prompt = torch.randint(3, 96, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    free, _ = run(target, draft, "ar", prompt, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    stop = free[4]
    stopped, _ = run(target, draft, "ar", prompt, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True,
                                                                 stop_token_ids=(stop,)))
    assert stopped == free[:free.index(stop) + 1]
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, stop_token_ids=(stop,), min_tokens=25)
    reference, _ = run(target, draft, "ar", prompt, params)
    assert len(reference) >= 25 and stop not in reference[:25] and reference[:5] != free[:5]
    tokens, metrics = run(target, draft, mode, prompt, params, policy, **trees)
    assert tokens == reference and all(t.checks > 0 for t in metrics.tiers)


@pytest.mark.parametrize("mode,policy", MODES)
@pytest.mark.parametrize("nodes", [3, 10, "auto"])
@pytest.mark.parametrize("shape", ["sequoia", "confidence"])
def test_greedy_with_trees_equals_plain_decoding(models, mode, policy, nodes, shape):
    """The bottom tier proposes trees (tree1: the draft's; tree2: the retrieval tier's in retrieval mode),
    shaped before each check (Sequoia) or as they grow (confidence)."""
    target, draft = models
    prompt = torch.randint(3, 96, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    params = SamplingParams(max_tokens=80, temperature=0, ignore_eos=True)
    reference, _ = run(target, draft, "ar", prompt, params)
    trees = dict(tree2=nodes) if mode == "retrieval" else dict(tree1=nodes)
    trees["tree_shape"] = shape
    tokens, metrics = run(target, draft, mode, prompt, params, policy, **trees)
    assert tokens == reference
    bottom = metrics.tiers[0]
    assert bottom.checks > 0 and bottom.mean_accepted_length >= 1
    assert nodes == "auto" or bottom.proposed / bottom.checks > 1  # auto may choose no tree on this machine


def test_an_auto_tree_in_triforce_mode_counts_the_targets_checks(models):
    """In triforce mode the auto size prices the target's checks of tier 2's rounds (trees.CheckAbove),
    from the target's forward costs measured after the prefill; in draft mode the target is the checker,
    and nothing checks above it."""
    target, draft = models
    prompt = torch.randint(3, 96, (80,), generator=torch.Generator().manual_seed(2)).tolist()
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    for mode in ("triforce", "draft"):
        cfg = EngineConfig(mode=mode, tree1="auto", **SETTINGS)
        engine = build_engine(cfg, target, draft, len(prompt) + params.max_tokens)
        engine.generate(prompt, params, ())
        above = engine.tree.above
        if mode == "draft":
            assert above is None
        else:
            assert above.gamma == cfg.gamma2 and above.rounds == 0 and 1 in above.seconds and len(above.seconds) > 4


@pytest.mark.parametrize("policy", ["static", "dynamic"])
@pytest.mark.parametrize("shape", [dict(tree1=10), dict(gamma1=4)])
def test_a_check_above_tier_1_takes_every_token_of_the_rounds_below(models, policy, shape):
    """In triforce mode tier 2's checks of a tree or a chain yield several tokens each; the target's check
    holds all that its rounds produced (gamma2 is the least), not the first gamma2 of them. The target
    drafts for itself (its streaming window and the retrieval budget hold the whole sequence), so that
    tier 2 accepts long paths."""
    target, _ = models
    draft = target
    prompt = torch.randint(3, 96, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    params = SamplingParams(max_tokens=80, temperature=0, ignore_eos=True)
    reference, _ = run(target, draft, "ar", prompt, params)
    tokens, metrics = run(target, draft, "triforce", prompt, params, policy, **shape, gamma2=2, window=240,
                          budget=256, prefill_chunk=128)
    assert tokens == reference
    retrieval, top = metrics.tiers
    assert retrieval.mean_accepted_length > 2  # the rounds overshoot gamma2 ...
    assert top.proposed / top.checks > 2  # ... and the target checks everything they overshot


@pytest.mark.parametrize("policy", ["static", "dynamic"])
def test_the_largest_checks_that_take_every_token_fit_the_caches(models, policy):
    """gamma1 = gamma2 = 8: the target's checks hold 8 to 16 tokens (a round of up to 9 on top of up to 7),
    all of which every cache must hold speculatively; the retrieval tier selects from a budget of 32. (By
    rounds: test_a_target_check_holds_what_rounds2_tier_2_checks_made, up to 27 tokens.)"""
    target, draft = models
    prompt = torch.randint(3, 96, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    params = SamplingParams(max_tokens=80, temperature=0, ignore_eos=True)
    reference, _ = run(target, draft, "ar", prompt, params)
    tokens, metrics = run(target, draft, "triforce", prompt, params, policy, gamma1=8, gamma2=8)
    assert tokens == reference
    assert metrics.tiers[1].proposed / metrics.tiers[1].checks > 8


@pytest.mark.parametrize("policy", ["static", "dynamic"])
@pytest.mark.parametrize("shape", [dict(tree1=10), dict(gamma1=8)])
def test_a_target_check_holds_what_rounds2_tier_2_checks_made(models, policy, shape):
    """rounds2 = 3: every target check follows exactly three tier-2 checks and holds every token they made,
    which a check by tokens would not (their count varies with what tier 2 accepted). The target drafts for
    itself, as in test_a_check_above_tier_1_takes_every_token_of_the_rounds_below, so that tier 2 accepts
    long paths: the target's checks hold up to 27 tokens, which every cache holds speculatively."""
    target, _ = models
    draft = target
    prompt = torch.randint(3, 96, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    params = SamplingParams(max_tokens=80, temperature=0, ignore_eos=True)
    reference, _ = run(target, draft, "ar", prompt, params)
    tokens, metrics = run(target, draft, "triforce", prompt, params, policy, rounds2=3, window=240, budget=256,
                          prefill_chunk=128, **shape)
    assert tokens == reference
    retrieval, top = metrics.tiers
    assert retrieval.checks == 3 * top.checks
    assert top.proposed == retrieval.accepted + retrieval.checks  # each tier-2 check: its accepted + 1
    assert top.proposed / top.checks > 9  # more than one round's tokens


@pytest.fixture(scope="module")
def char_grammars(tmp_path_factory):
    """Structured outputs over the tiny models' vocabularies read as single characters (checkpoints.CHARS)."""
    from transformers import AutoTokenizer

    made = {}
    for vocab in (96, 8):
        folder = tmp_path_factory.mktemp(f"chars{vocab}")
        write_char_tokenizer(folder, vocab)
        made[vocab] = Grammars(AutoTokenizer.from_pretrained(folder), vocab, [EOS])
    return made


SENTENCE = StructuredOutputs(regex=r"(ab|[c-k][a-z]*)( [a-z0-9]+)*\.")


@pytest.mark.parametrize("mode,policy,trees", [(m, p, {}) for m, p in MODES] + [
    ("auto", "static", {}), ("triforce", "static", dict(tree1=8)), ("retrieval", "dynamic", dict(tree2=8)),
    ("draft", "static", dict(tree1=8, tree_shape="confidence"))])
def test_greedy_with_structured_outputs_equals_plain_decoding_with_them(models, char_grammars, mode, policy, trees):
    """Every tier's row is masked by the constraint after its own history (a chain's earlier proposals, a
    tree node's path): each mode follows `ar` under the same constraint, whose text it keeps to."""
    target, draft = models
    prompt = torch.randint(3, 96, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    free, _ = run(target, draft, "ar", prompt, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    params = SamplingParams(max_tokens=40, temperature=0, structured_outputs=SENTENCE)
    grammars = char_grammars[96]
    reference, _ = run(target, draft, "ar", prompt, params, guide=grammars.guide(SENTENCE))
    assert reference != free
    checker = grammars.guide(SENTENCE)  # the text is one the constraint takes, or a prefix of one
    text = reference[:-1] if reference[-1] == EOS else reference
    assert all(checker.allowed(text[:i]) is not None for i in range(len(text) + 1))
    tokens, metrics = run(target, draft, mode, prompt, params, policy, guide=grammars.guide(SENTENCE), **trees)
    assert tokens == reference and all(t.checks > 0 for t in metrics.tiers)


@pytest.mark.parametrize("mode", ["ar", "draft", "triforce"])
def test_a_token_the_constraint_forces_is_taken_without_a_forward(models, char_grammars, monkeypatch, mode):
    """Where the constraint allows one token (a literal's next, end-of-sequence after a complete text) every
    tier takes it without a forward or a check, while it and the tiers below lag by fewer than FORCED_LAG
    tokens: a choice of one text costs each tier a forward per FORCED_LAG tokens at most (checks that accept
    all they are shown), where a forward a token would be needed otherwise; the output is that text."""
    from triforce.models.llama import LlamaModel

    target, draft = models
    decoding = []  # the model calls that return logits (the prefill's return none)
    real = LlamaModel.forward_batch

    def forward_batch(self, steps, caches, logits_for="all"):
        if "none" not in (logits_for if isinstance(logits_for, list) else [logits_for]):
            decoding.append(self)
        return real(self, steps, caches, logits_for)

    monkeypatch.setattr(LlamaModel, "forward_batch", forward_batch)
    prompt = torch.randint(3, 96, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    spec = StructuredOutputs(choice=["hello world"])
    params = SamplingParams(max_tokens=40, temperature=0.8, seed=3, structured_outputs=spec)
    tokens, metrics = run(target, draft, mode, prompt, params, guide=char_grammars[96].guide(spec))
    assert tokens == [3 + CHARS.index(c) for c in "hello world"] + [EOS]
    tiers = len(metrics.tiers) + 1
    assert len(decoding) <= tiers * -(-len(tokens) // engine_module.FORCED_LAG)  # without: a forward a token
    assert all(t.accepted == t.proposed for t in metrics.tiers)
    if mode != "ar":  # a forced token is no proposal: those of the draft's forwards are (all were counted)
        assert 0 < metrics.tiers[0].proposed <= sum(model is draft for model in decoding) < len(tokens)


def test_a_forced_token_outside_the_allowed_ids_ends_the_request(models, char_grammars):
    """Where the constraint allows one token that allowed_token_ids leave out, no token is left: the request
    ends there with the rules named, whether the token comes forced or from a forward (log-probabilities
    turn forced tokens off); the rows fell back on the allowed ids, and the text broke the constraint."""
    target, draft = models
    prompt = torch.randint(3, 96, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    spec = StructuredOutputs(choice=["hello world"])
    allowed = tuple(3 + CHARS.index(c) for c in "helo")  # no 'w', ' ', 'r', 'd'
    for logprobs in (None, 0):
        params = SamplingParams(max_tokens=12, temperature=0, structured_outputs=spec, ignore_eos=True,
                                allowed_token_ids=allowed, logprobs=logprobs)
        with pytest.raises(RulesContradict, match="structured output leave no token to choose after 5 generated"):
            run(target, draft, "triforce", prompt, params, guide=char_grammars[96].guide(spec))


@pytest.mark.parametrize("mode,policy", [("triforce", "static"), ("triforce", "dynamic"), ("retrieval", "static"),
                                         ("auto", "static")])
def test_a_long_forced_literal_before_free_text_fits_the_caches(models, char_grammars, mode, policy):
    """A literal of 44 forced tokens, then free text: the tiers above the bottom stop taking forced tokens
    once the caches lag by FORCED_LAG (the retrieval cache holds only so many tokens past its last sync),
    and the output equals plain decoding's under the constraint."""
    target, draft = models
    prompt = torch.randint(3, 96, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    spec = StructuredOutputs(regex=r"the quick brown fox jumps over the lazy dog, [a-z ]+\.")
    params = SamplingParams(max_tokens=70, temperature=0, structured_outputs=spec)
    reference, _ = run(target, draft, "ar", prompt, params, guide=char_grammars[96].guide(spec))
    tokens, metrics = run(target, draft, mode, prompt, params, policy, guide=char_grammars[96].guide(spec))
    assert tokens == reference and len(tokens) > 50 and (mode == "auto" or all(t.checks > 0 for t in metrics.tiers))


def test_plain_decoding_equals_transformers_generate(tiny_dir, models):
    from transformers import AutoModelForCausalLM

    target, _ = models
    hf = AutoModelForCausalLM.from_pretrained(tiny_dir("engine-target"), dtype=torch.float32).eval()
    prompt = torch.randint(3, 96, (60,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = hf.generate(prompt[None], max_new_tokens=40, do_sample=False, min_new_tokens=40)[0, 60:]
    tokens, _ = run(target, None, "ar", prompt.tolist(), SamplingParams(max_tokens=40, ignore_eos=True))
    assert tokens == expected.tolist()


@pytest.mark.parametrize("show", [True, False])
def test_a_long_prompt_shows_each_tiers_prefill_bar_when_asked(models, capfd, monkeypatch, show):
    import triforce.coordinator.engine as engine_module

    monkeypatch.setattr(engine_module, "PROGRESS_MIN_TOKENS", 30)
    target, draft = models
    prompt = torch.randint(3, 96, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    cfg = EngineConfig(mode="triforce", **SETTINGS)
    build_engine(cfg, target, draft, 50).generate(prompt, SamplingParams(max_tokens=2, ignore_eos=True),
                                                  show_progress=show)
    err = capfd.readouterr().err
    assert ("prefill target" in err and "prefill draft" in err) == show and ("prefill" in err) == show


def test_stops_at_eos_and_max_tokens(models):
    target, draft = models
    prompt = torch.randint(3, 96, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    free, _ = run(target, draft, "triforce", prompt, SamplingParams(max_tokens=30, ignore_eos=True))
    stop_id = free[10]
    cfg = EngineConfig(mode="triforce", **SETTINGS)
    tokens, _ = build_engine(cfg, target, draft, 70).generate(prompt, SamplingParams(max_tokens=30), (stop_id,))
    assert tokens == free[: free.index(stop_id) + 1]


def test_seeded_sampling_is_reproducible(models):
    target, draft = models
    prompt = list(range(3, 60))
    params = SamplingParams(max_tokens=30, temperature=0.8, seed=5, ignore_eos=True)
    first = run(target, draft, "triforce", prompt, params)[0]
    assert first == run(target, draft, "triforce", prompt, params)[0]
    others = {tuple(run(target, draft, "triforce", prompt, dataclasses.replace(params, seed=s))[0]) for s in (6, 7)}
    assert others != {tuple(first)}  # the seed decides: a run that ignored it (or the temperature) would not differ


# --- sampling: the first two tokens' joint distribution equals the target's -------------------------

@pytest.fixture(scope="module")
def small_vocab(tiny_dir):
    spec = dict(vocab_size=8, hidden_size=32, num_heads=4, num_kv_heads=2, scale=4)
    return [load_model(tiny_dir(f"v8-{i}", seed=20 + i, num_layers=layers, **spec)) for i, layers in enumerate((1, 2, 2))]


# The two-token tests' retrieval tier chooses 3 of the prompt's 10 chunks in both of the target's layers, so
# it is not the target (with one layer kept whole, as SETTINGS has it, a 1-layer target's retrieval tier was
# the target itself, and nothing the target rejected of it was ever tested).
SELECTING = {**SETTINGS, "budget": 12, "full_layers": 0}


def exact_two_token_distribution(target, prompt, params, grammars=None):
    """grammars: with params.structured_outputs, each row masked by a fresh llguidance matcher of it."""
    def allowed(history):
        from llguidance import LLMatcher

        matcher = LLMatcher(grammars._ll_tokenizer(), grammars.check(params.structured_outputs), log_level=0)
        if matcher.try_consume_tokens(history) < len(history):  # a first token of probability 0
            return torch.ones(8, dtype=torch.bool)
        return torch.tensor(list(matcher.compute_logit_bias()[:8])) > 0

    def dist(tokens):
        cache = FullKVCache(target.config, len(tokens), target.dtype, "cpu")
        logits = target(torch.tensor(tokens), cache, logits_for="last")[0].clone()
        for token, value in params.logit_bias:  # vLLM's order: the bias, then the penalties
            logits[token] += value
        if params.allowed_token_ids is not None:
            logits[[t for t in range(8) if t not in params.allowed_token_ids]] = float("-inf")
        generated = tokens[len(prompt):]
        for bad in params.bad_words_ids:
            if len(generated) >= len(bad) - 1 and tuple(generated[len(generated) - len(bad) + 1:]) == bad[:-1]:
                logits[bad[-1]] = float("-inf")
        if len(tokens) - len(prompt) < params.min_tokens:
            logits[list(params.stop_token_ids)] = float("-inf")
        logits = reference_penalized(logits, prompt, tokens[len(prompt):], params.presence_penalty,
                                     params.frequency_penalty, params.repetition_penalty)
        if params.structured_outputs is not None:
            logits[~allowed(tokens[len(prompt):])] = float("-inf")
        return probabilities(logits[None], params.temperature, params.top_k, params.top_p, min_p=params.min_p)[0]

    first = dist(prompt)
    return {(a, b): float(first[a] * dist(prompt + [a])[b]) for a, b in itertools.product(range(8), repeat=2)}


# Runs per two-token test: 1,200 (2,000 before; these tests took over a third of the suite's time). Moving
# 0.05 of probability between two outcomes of 0.1 (about 30 bins) is found with power 0.97 at alpha 1e-3
# (1.0 at 2,000); 0.03: 0.24 (0.65).
TWO_TOKEN_TRIALS = 1200


def assert_two_token_distribution(make_run, expected, trials=TWO_TOKEN_TRIALS):
    """make_run(seed): a seeded request's run of two tokens (HierarchyEngine.run)."""
    counts = dict.fromkeys(expected, 0)
    for tokens in outputs(make_run, range(trials)):
        counts[(tokens[0], tokens[1])] += 1
    for outcome, count in counts.items():
        assert expected[outcome] > 0 or count == 0, f"sampled {outcome}, which has target probability 0"
    # Pool rare outcomes so every chi-square bin expects at least 5.
    big = [o for o in expected if expected[o] * trials >= 5]
    small = [o for o in expected if o not in big and expected[o] > 0]
    observed = [counts[o] for o in big] + ([sum(counts[o] for o in small)] if small else [])
    wanted = [expected[o] * trials for o in big] + ([sum(expected[o] for o in small) * trials] if small else [])
    wanted = [w * trials / sum(wanted) for w in wanted]  # float32 probabilities sum to 1 only roughly
    assert chisquare(observed, wanted).pvalue > ALPHA


SAMPLING_CASES = [
    ("triforce", "static", dict(temperature=1.0), {}),
    ("triforce", "dynamic", dict(temperature=0.7, top_p=0.9), {}),
    ("retrieval", "static", dict(temperature=1.0, top_k=5), {}),
    ("draft", "static", dict(temperature=1.0), {}),
    # token trees at the bottom boundary (siblings sampled without replacement)
    ("triforce", "static", dict(temperature=1.0), dict(tree1=6)),
    ("retrieval", "dynamic", dict(temperature=1.0, top_k=5), dict(tree2=6)),
    ("draft", "static", dict(temperature=0.8, top_p=0.9), dict(tree1=6)),
    # trees shaped as they grow, by the proposer's confidence at each node
    ("triforce", "static", dict(temperature=1.0), dict(tree1=6, tree_shape="confidence", gamma2=1)),
    ("retrieval", "dynamic", dict(temperature=1.0, top_k=5), dict(tree2=6, tree_shape="confidence")),
    # the target checks every token of tier 2's checks, here more than gamma2: lengths the rounds decide
    ("triforce", "dynamic", dict(temperature=1.0), dict(tree1=6, gamma2=1)),
    ("triforce", "static", dict(temperature=1.0), dict(gamma1=3, gamma2=1)),
    # or of a fixed number of tier-2 checks, rounds2 (gamma2 back at its default, which rounds leave unused)
    ("triforce", "static", dict(temperature=1.0), dict(gamma2=6, rounds2=3)),
    # a tree's nodes mixed with the prompt lookup's copies (1-grams: a 40-token prompt over 8 tokens has
    # a candidate at every node)
    ("triforce", "static", dict(temperature=1.0), dict(tree1=6, lookup=1)),
    # a logit bias (every tier's rows): one token boosted, one banned
    ("triforce", "static", dict(temperature=1.0, logit_bias={3: 2.0, 5: -100}), dict(tree1=6)),
    ("retrieval", "dynamic", dict(temperature=0.8, logit_bias={1: 1.5, 6: -100}), {}),
    # penalties: the second token's rows (the target's, a tree node's) by the first token on their path;
    # min_p (vLLM's: after the temperature, before top-k); min_tokens: the first token's rows (every
    # tier's) without the stop token, the second's with it
    ("triforce", "static", dict(temperature=1.0, presence_penalty=1.5, frequency_penalty=0.5,
                                repetition_penalty=1.3, logit_bias={3: 2.0}), dict(tree1=6)),
    ("retrieval", "dynamic", dict(temperature=0.8, frequency_penalty=2.0, min_p=0.5, top_k=4, min_tokens=1,
                                  stop_token_ids=(3,)), {}),
    ("triforce", "static", dict(temperature=1.0, min_p=0.6, min_tokens=1, stop_token_ids=(3,)), dict(tree1=6)),
    # the same rules where the target checks the draft's tree itself (above, tier 2: the target's weights)
    ("draft", "static", dict(temperature=1.0, presence_penalty=1.5, repetition_penalty=1.3, logit_bias={3: 2.0},
                             min_tokens=1, stop_token_ids=(3,)), dict(tree1=6)),
    # allowed token ids and bad words (a token; a bigram banned in the second token's rows after its first)
    ("triforce", "static", dict(temperature=1.0, allowed_token_ids=(0, 2, 3, 4, 6),
                                bad_words_ids=((2,), (3, 4), (6, 6))), dict(tree1=6)),
    ("retrieval", "dynamic", dict(temperature=0.8, top_k=3, bad_words_ids=((1, 1), (5,), (4, 0, 2))), dict(lookup=1)),
    # structured outputs: the first token one of a, b, c (ids 3-5), the second one of b-e (4-7); the prompt
    # lookup's 1-gram copies are often tokens the constraint refuses
    ("triforce", "static", dict(temperature=1.0, structured_outputs=StructuredOutputs(regex="[a-c][b-e]+")),
     dict(tree1=6, lookup=1)),
    ("retrieval", "dynamic", dict(temperature=0.8, top_k=3, structured_outputs=StructuredOutputs(regex="[a-c][b-e]+")),
     dict(lookup=1)),
    ("triforce", "dynamic", dict(temperature=1.0, structured_outputs=StructuredOutputs(choice=["ab", "bd", "ce", "cc"])),
     dict(gamma1=3, gamma2=1)),
]


@pytest.mark.parametrize("policy", ["static", "dynamic"])
def test_the_two_token_tests_retrieval_tier_is_not_the_target(small_vocab, policy):
    """What the two-token tests check is only a test of the retrieval tier's verification if the target
    rejects some of its proposals: with SELECTING it does."""
    draft, _, target = small_vocab
    prompt = [int(t) for t in torch.randint(0, 8, (40,), generator=torch.Generator().manual_seed(4))]
    proposed = accepted = 0
    for seed in range(40):
        engine = build_engine(EngineConfig(mode="retrieval", retrieval_policy=policy, gamma2=3, **SELECTING),
                              target, draft, len(prompt) + 2)
        _, metrics = engine.generate(prompt, SamplingParams(max_tokens=2, temperature=1.0, seed=seed,
                                                            ignore_eos=True))
        proposed, accepted = proposed + metrics.tiers[0].proposed, accepted + metrics.tiers[0].accepted
    assert 0 < accepted < proposed


@pytest.mark.parametrize("mode,policy,sampling,trees", SAMPLING_CASES)
def test_modes_sample_the_target_distribution(small_vocab, char_grammars, mode, policy, sampling, trees,
                                              monkeypatch):
    draft, _, target = small_vocab
    prompt = [int(t) for t in torch.randint(0, 8, (40,), generator=torch.Generator().manual_seed(4))]
    params = SamplingParams(max_tokens=2, ignore_eos=True, **sampling)
    grammars = char_grammars[8]
    expected = exact_two_token_distribution(target, prompt, params, grammars)
    cfg = EngineConfig(mode=mode, retrieval_policy=policy, **{"gamma1": 2, "gamma2": 3, **trees}, **SELECTING)

    def run_of(seed):
        engine = build_engine(cfg, target, draft, len(prompt) + 2)
        return engine.run(prompt, SamplingParams(max_tokens=2, ignore_eos=True, seed=seed, **sampling),
                          guide=grammars.guide(params.structured_outputs))

    if cfg.proposal_tree:  # the trees really branch (siblings drawn without replacement are what is tested)
        grown, real = [], engine_module.grow_tree

        def recording(*args, **kwargs):
            tokens, parents, rows = yield from real(*args, **kwargs)
            grown.append(parents)
            return tokens, parents, rows

        monkeypatch.setattr(engine_module, "grow_tree", recording)
        outputs(run_of, range(3))
        assert any(len(set(parents)) < len(parents) for parents in grown), grown
        monkeypatch.undo()
    assert_two_token_distribution(run_of, expected)


def test_reduced_vocabulary_draft_samples_the_target_distribution(tiny_dir, small_vocab):
    """The draft can propose only tokens {0, 2, 3, 5, 7}: the residual must supply the others."""
    _, _, target = small_vocab
    folder = tiny_dir("v8-reduced", seed=30, num_layers=1, vocab_size=6, hidden_size=32, num_heads=4,
                      num_kv_heads=2, scale=4)
    draft = load_model(write_reduced_vocabulary(folder, [0, 2, 3, 5, 7], 8))
    prompt = [int(t) for t in torch.randint(0, 8, (30,), generator=torch.Generator().manual_seed(7))]
    params = SamplingParams(max_tokens=2, ignore_eos=True, temperature=1.0)
    expected = exact_two_token_distribution(target, prompt, params)
    cfg = EngineConfig(mode="triforce", gamma1=2, gamma2=3, **SELECTING)

    def run_of(seed):
        engine = build_engine(cfg, target, draft, len(prompt) + 2)
        return engine.run(prompt, SamplingParams(max_tokens=2, ignore_eos=True, seed=seed, temperature=1.0))

    assert_two_token_distribution(run_of, expected)


@pytest.mark.parametrize("rule", [dict(structured_outputs=StructuredOutputs(regex="[bd][a-e]")),
                                  dict(allowed_token_ids=(1, 4, 6))])
def test_a_reduced_vocabulary_draft_under_a_constraint_samples_the_target_distribution(tiny_dir, small_vocab,
                                                                                      char_grammars, rule):
    """The draft lacks every token the constraint allows first (b and d: ids 4 and 6; or the allowed
    token ids): its row there would give every token probability 0; it proposes uniformly among the
    allowed ones instead."""
    _, _, target = small_vocab
    folder = tiny_dir("v8-reduced", seed=30, num_layers=1, vocab_size=6, hidden_size=32, num_heads=4,
                      num_kv_heads=2, scale=4)
    draft = load_model(write_reduced_vocabulary(folder, [0, 2, 3, 5, 7], 8))
    prompt = [int(t) for t in torch.randint(0, 8, (30,), generator=torch.Generator().manual_seed(7))]
    sampling = dict(max_tokens=2, ignore_eos=True, temperature=1.0, **rule)
    grammars = char_grammars[8]
    expected = exact_two_token_distribution(target, prompt, SamplingParams(**sampling), grammars)
    cfg = EngineConfig(mode="triforce", gamma1=2, gamma2=3, **SELECTING)

    def run_of(seed):
        engine = build_engine(cfg, target, draft, len(prompt) + 2)
        return engine.run(prompt, SamplingParams(seed=seed, **sampling),
                          guide=grammars.guide(sampling.get("structured_outputs")))

    assert_two_token_distribution(run_of, expected)


@pytest.mark.parametrize("case", ["distinct", "draft_equals_target", "middle_equals_draft"])
def test_three_distinct_models_sample_the_target_distribution(small_vocab, case):
    draft, middle, target = small_vocab
    if case == "draft_equals_target":
        draft = middle = target
    elif case == "middle_equals_draft":
        middle = draft
    prompt = [int(t) for t in torch.randint(0, 8, (12,), generator=torch.Generator().manual_seed(5))]
    params = SamplingParams(max_tokens=2, temperature=1.0, ignore_eos=True)
    expected = exact_two_token_distribution(target, prompt, params)

    def run_of(seed):
        tiers = [Tier(name, m, FullKVCache(m.config, 40, m.dtype, "cpu"))
                 for name, m in (("draft", draft), ("middle", middle))]
        engine = HierarchyEngine(tiers + [LocalVerifier(target, 40)], [2, 3])
        return engine.run(prompt, SamplingParams(max_tokens=2, temperature=1.0, ignore_eos=True, seed=seed))

    assert_two_token_distribution(run_of, expected)


def test_retrieval_tier_learns_how_the_target_judged_its_proposals(models):
    """The static policy's rebuild trigger must watch the target's acceptance of the retrieval tier,
    not the retrieval tier's acceptance of the draft."""
    target, draft = models
    prompt = torch.randint(3, 96, (150,), generator=torch.Generator().manual_seed(8)).tolist()
    cfg = EngineConfig(mode="triforce", **SETTINGS)
    engine = build_engine(cfg, target, draft, 190)
    seen = []
    retrieval = engine.tiers[1]
    retrieval.observe = lambda proposed, accepted: seen.append((proposed, accepted))
    _, metrics = engine.generate(prompt, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    target_check = metrics.tiers[1]  # the target checking the retrieval tier
    assert (sum(p for p, _ in seen), sum(a for _, a in seen)) == (target_check.proposed, target_check.accepted)


def test_low_acceptance_by_the_target_triggers_a_rebuild(models):
    target, draft = models
    engine = build_engine(EngineConfig(mode="retrieval", **SETTINGS), target, None, 190)
    retrieval = engine.tiers[0]
    engine.generate([3 + i % 90 for i in range(147)], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    before = retrieval.rebuilds
    for _ in range(SETTINGS.get("refresh_window", 32)):
        retrieval.observe(1, 0)
    retrieval.sync()
    assert retrieval.rebuilds == before + 1
    for _ in range(SETTINGS.get("refresh_window", 32)):  # asked for again when the sync rebuilds anyway
        retrieval.observe(1, 0)
    retrieval.cache.reset()  # (as a refresh past refresh_every tokens does)
    retrieval.sync()
    assert retrieval.rebuilds == before + 2  # once: the second rebuild chose the same chunks again


def test_draft_prefill_skips_what_its_window_would_evict(models):
    """A streaming draft's prefill computes the sinks and the last window only: its next-token logits equal
    those of a cache fed just those tokens, and it runs far fewer tokens than the prompt holds."""
    from triforce.cache.streaming import StreamingKVCache

    _, draft = models
    tokens = torch.randint(3, 96, (300,), generator=torch.Generator().manual_seed(9)).tolist()

    def tier():
        cache = StreamingKVCache(draft.config, 4, 32, 8, draft.rope, draft.dtype, draft.device)
        return Tier("draft", draft, cache, prefill_chunk=32)

    skipping = tier()
    fed = sum(step.n for step in _run_steps(skipping, tokens[:-1]))
    assert skipping.length == 299 and fed == 4 + 32  # the sinks, then the last window
    reference = tier()
    reference.forward(Step.chain(tokens[:4] + tokens[267:299], 0), "none")
    want = reference.forward(Step.chain(tokens[-1:], 36))
    got = skipping.forward(Step.chain(tokens[-1:], 299))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="cannot roll back"):
        skipping.cache.rollback(100)  # into the skipped tokens


def _run_steps(tier, tokens):
    for step in tier.prefill_steps(tokens):
        tier.forward(step, "none")
        yield step


@pytest.mark.parametrize("mode,policy,trees", [(m, p, {}) for m, p in MODES] + [("auto", "static", {})] + [
    ("triforce", "dynamic", dict(tree1=6)), ("draft", "static", dict(tree1=6)), ("retrieval", "static", dict(tree2=6))])
def test_greedy_with_prompt_lookup_equals_plain_decoding(models, mode, policy, trees):
    """The bottom tier's proposals, chains or trees, mixed with copies of the sequence's own 2-grams
    (speculation/lookup.py). The prompt repeats a block, so the lookup's weight nears 1 and its copies
    win the argmax (a tree's first child)."""
    target, draft = models
    prompt = (torch.randint(3, 96, (20,), generator=torch.Generator().manual_seed(1)).tolist() * 8)[:150]
    params = SamplingParams(max_tokens=80, temperature=0, ignore_eos=True)
    reference, _ = run(target, draft, "ar", prompt, params)
    tokens, metrics = run(target, draft, mode, prompt, params, policy, lookup=2, **trees)
    assert tokens == reference
    assert metrics.lookup["candidates"] > 100 and metrics.lookup["weight"] > 0.9
    assert metrics.tiers and metrics.tiers[0].proposed > 0  # a bottom tier proposed (auto: its script's)


def record_proposals(monkeypatch) -> list[int]:
    """The tokens a run's bottom tier proposes: a chain's draws, a tree's nodes."""
    proposed, sample, grow = [], engine_module.sample, engine_module.grow_tree

    def drawn(row, generator, greedy, proposal=False):
        token = sample(row, generator, greedy, proposal)
        proposed.extend([token] if proposal else [])
        return token

    def grown(*args, **kwargs):
        tokens, parents, rows = yield from grow(*args, **kwargs)
        proposed.extend(tokens)
        return tokens, parents, rows

    monkeypatch.setattr(engine_module, "sample", drawn)
    monkeypatch.setattr(engine_module, "grow_tree", grown)
    return proposed


@pytest.mark.parametrize("rule", ["bad_words", "allowed_token_ids"])
@pytest.mark.parametrize("trees", [{}, {"tree1": 6}])
def test_no_lookup_copy_the_request_bans_is_proposed(models, monkeypatch, rule, trees):
    """The prompt repeats a block whose tokens the request bans (bad words, or allowed_token_ids without
    them): the lookup's copies (block tokens, its weight near 1) won a greedy chain's argmax or a tree's
    first children and were proposed, each certain to be rejected."""
    target, draft = models
    block = torch.randint(3, 96, (20,), generator=torch.Generator().manual_seed(1)).tolist()
    prompt = (block * 8)[:150]
    ban = dict(bad_words_ids=tuple((t,) for t in sorted(set(block)))) if rule == "bad_words" else \
        dict(allowed_token_ids=tuple(t for t in range(96) if t not in block))
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True, **ban)
    reference, _ = run(target, draft, "ar", prompt, params)
    proposed = record_proposals(monkeypatch)
    tokens, metrics = run(target, draft, "draft", prompt, params, lookup=2, gamma1=4, **trees)
    assert tokens == reference and metrics.lookup["candidates"] > 0 and proposed
    assert not set(proposed) & set(block)


def test_a_reduced_vocabulary_draft_proposes_the_lookups_copies_it_lacks(tiny_dir, models, monkeypatch):
    """A reduced-vocabulary draft's logits are -inf for the tokens it lacks; the lookup's copies are how
    it proposes them (identifiers, names): those are no ban, and are proposed, in chains and trees."""
    target, _ = models
    kept = list(range(3, 96, 2))  # odd tokens only
    folder = tiny_dir("engine-draft-reduced", seed=12, num_layers=1, scale=25, vocab_size=len(kept) + 1)
    draft = load_model(write_reduced_vocabulary(folder, kept, 96))
    block = [4, 8, 15, 16, 23, 42, 7, 9, 11, 13] * 2
    prompt = (block * 8)[:150]
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    reference, _ = run(target, None, "ar", prompt, params)
    for trees in ({}, {"tree1": 6}):
        proposed = record_proposals(monkeypatch)
        assert run(target, draft, "draft", prompt, params, lookup=2, gamma1=4, **trees)[0] == reference
        assert any(t % 2 == 0 for t in proposed), trees  # tokens the draft lacks, copied
        monkeypatch.undo()


def test_lookup_is_on_by_default_for_chains_and_trees():
    """Left unset, the lookup feeds the bottom tier's proposals with DEFAULT_LOOKUP, chains and trees alike."""
    assert EngineConfig().lookup_n == DEFAULT_LOOKUP > 0
    assert EngineConfig(mode="draft", tree1=4).lookup_n == DEFAULT_LOOKUP
    assert dataclasses.replace(EngineConfig(mode="triforce"), tree1=8).lookup_n == DEFAULT_LOOKUP
    assert EngineConfig(mode="draft", lookup=0).lookup_n == 0
    assert EngineConfig(mode="retrieval", tree2=4, lookup=2).lookup_n == 2


# --- chains that end early (stop_below: HierarchyEngine._produce) ---------------------------------------

def record_confidences(monkeypatch) -> list[float]:
    """The bottom tier's confidence in each proposal it makes from now on (its model's top probability)."""
    seen = []

    def recorded(logits):
        seen.append(top_probability(logits))
        return seen[-1]

    monkeypatch.setattr(engine_module, "top_probability", recorded)
    return seen


@pytest.mark.parametrize("mode,policy", MODES)
def test_greedy_with_chains_that_end_early_equals_plain_decoding(models, mode, policy, monkeypatch):
    """The bottom tier ends a chain after a proposal it was less sure of than the threshold: the median of
    its confidences here, so that some chains end early and some run to gamma."""
    target, draft = models
    prompt = torch.randint(3, 96, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    params = SamplingParams(max_tokens=80, temperature=0, ignore_eos=True)
    reference, _ = run(target, draft, "ar", prompt, params)
    seen = record_confidences(monkeypatch)
    run(target, draft, mode, prompt, params, policy, gamma1=4, gamma2=4, stop_below=1e-9)  # stops never
    tokens, metrics = run(target, draft, mode, prompt, params, policy, gamma1=4, gamma2=4,
                          stop_below=float(torch.tensor(seen).median()))
    assert tokens == reference
    bottom = metrics.tiers[0]
    assert bottom.checks < bottom.proposed < 4 * bottom.checks  # some chains ended early, not all at once


@pytest.mark.parametrize("mode,policy,sampling", [("draft", "static", dict(temperature=1.0)),
                                                  ("triforce", "dynamic", dict(temperature=0.8, top_p=0.9)),
                                                  ("retrieval", "static", dict(temperature=1.0, top_k=5))])
def test_chains_that_end_early_sample_the_target_distribution(small_vocab, mode, policy, sampling, monkeypatch):
    """The threshold lies just above the bottom tier's confidence in its first proposal (which depends on
    the prompt only), so the first chain always ends after one token; later chains end where they do."""
    draft, _, target = small_vocab
    prompt = [int(t) for t in torch.randint(0, 8, (40,), generator=torch.Generator().manual_seed(4))]
    params = SamplingParams(max_tokens=2, ignore_eos=True, **sampling)
    expected = exact_two_token_distribution(target, prompt, params)
    settings = dict(mode=mode, retrieval_policy=policy, gamma1=3, gamma2=3, lookup=0, **SELECTING)  # no copies
    seen = record_confidences(monkeypatch)
    build_engine(EngineConfig(**settings, stop_below=1e-9), target, draft, len(prompt) + 2).generate(prompt, params)
    cfg = EngineConfig(**settings, stop_below=seen[0] + 1e-4)
    probe = build_engine(cfg, target, draft, len(prompt) + 2)
    checked = []
    probe._record = lambda level, proposed, accepted: checked.append((level, proposed))
    probe.generate(prompt, params)
    assert checked[0] == (1, 1)

    def run_of(seed):
        engine = build_engine(cfg, target, draft, len(prompt) + 2)
        return engine.run(prompt, SamplingParams(max_tokens=2, ignore_eos=True, seed=seed, **sampling))

    assert_two_token_distribution(run_of, expected)


def test_a_lookup_copy_does_not_end_a_chain(models, monkeypatch):
    """A proposal copied by the prompt lookup is as sure as the lookup's record, not as the model: with a
    threshold above every confidence of the tiny draft, chains still run past their copies (the repeated
    block makes the lookup's copies win the argmax), and greedy still equals plain decoding."""
    target, draft = models
    prompt = (torch.randint(3, 96, (20,), generator=torch.Generator().manual_seed(1)).tolist() * 8)[:150]
    params = SamplingParams(max_tokens=80, temperature=0, ignore_eos=True)
    reference, _ = run(target, draft, "ar", prompt, params)
    seen = record_confidences(monkeypatch)
    tokens, metrics = run(target, draft, "draft", prompt, params, lookup=2, gamma1=4, stop_below=0.99)
    assert tokens == reference and max(seen) < 0.99
    assert metrics.tiers[0].proposed > metrics.tiers[0].checks  # some chains went on past a proposal


def test_chain_stop_settings():
    for bad in (1.0, -0.1):
        with pytest.raises(ConfigError, match="stop_below must be a probability"):
            EngineConfig(stop_below=bad)
    with pytest.raises(ConfigError, match="stop_below ends chains early"):
        EngineConfig(mode="draft", tree1=4, stop_below=0.3)


def test_tree_settings():
    with pytest.raises(ConfigError, match="tree_shape must be one of sequoia, confidence"):
        EngineConfig(mode="triforce", tree1=4, tree_shape="eagle")
    with pytest.raises(ConfigError, match="must fit the draft's streaming window"):
        EngineConfig(mode="triforce", tree1=20, window=16)
    assert EngineConfig(mode="retrieval", tree2=20, window=16).tree2 == 20  # the retrieval tier has no window


def test_rounds_settings():
    with pytest.raises(ConfigError, match="gamma2 8 is unused while rounds2"):
        EngineConfig(mode="triforce", gamma2=8, rounds2=2)
    assert EngineConfig(mode="triforce", gamma2=8).rounds2 == 0  # by tokens, the default
    assert EngineConfig(mode="retrieval", gamma2=8, rounds2=2).gamma2 == 8  # its gamma2: the retrieval tier's chain
    with pytest.raises(ConfigError, match="rounds2 must be in"):
        EngineConfig(rounds2=-1)
    with pytest.raises(ConfigError, match="must be <= 256: a target check holds"):
        EngineConfig(mode="triforce", tree1=64, rounds2=4, window=256)


def test_budget_settings():
    """A budget of one chunk kept one of the two chunks always kept (the sink or the latest, as topk
    happened to pick): a budget is at least two chunks, a multiple of the chunk size."""
    for budget in (8, 20, 0):
        with pytest.raises(ConfigError, match="at least two chunks"):
            EngineConfig(mode="triforce", budget=budget, chunk_size=8)
    with pytest.raises(ValueError, match="at least two chunks"):
        RetrievalKVCache(None, budget=8, chunk_size=8)  # (refused before it reads its source)
    assert EngineConfig(mode="triforce", budget=16, chunk_size=8).budget == 16


def test_the_largest_speculation_slack_fits_the_rope_tables_margin():
    """A forward's speculative tokens may run past the model's last position by the slack: the RoPE table
    holds POSITION_MARGIN rows past it, so it never grows mid-request (CUDA graphs hold its address). The
    largest slack any config allows (gammas of 128 together, both trees at their largest) fits."""
    from triforce.config import MAX_TREE
    from triforce.coordinator.hierarchy import speculation_slack
    from triforce.models.rope import POSITION_MARGIN

    largest = max(speculation_slack(EngineConfig(mode=mode, gamma1=64, gamma2=64, tree1=MAX_TREE, tree2=MAX_TREE,
                                                 window=256))
                  for mode in ("draft", "retrieval"))
    assert largest <= POSITION_MARGIN
    for most in (dict(gamma1=122, rounds2=2), dict(gamma1=15, rounds2=16), dict(gamma1=1, tree1=MAX_TREE, rounds2=3),
                 dict(gamma1=64, gamma2=64, tree1=MAX_TREE)):  # the largest by rounds, and by tokens
        assert speculation_slack(EngineConfig(mode="triforce", window=256, **most)) <= POSITION_MARGIN
    assert speculation_slack(EngineConfig(mode="auto", gamma1=100, gamma2=28)) <= POSITION_MARGIN
