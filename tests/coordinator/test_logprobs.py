"""Log-probabilities (SamplingParams.logprobs) are the target's, at the right position, in every mode: equal
to a single forward of the target over the prompt and the output, before temperature, top-k and top-p."""
import copy

import pytest
import torch

from scripted_planner import follow_script
from triforce.cache.full import FullKVCache
from triforce.config import ConfigError, EngineConfig
from triforce.sampling_params import SamplingParams
from triforce.coordinator.hierarchy import build_engine
from triforce.models.loader import load_model

SETTINGS = dict(budget=32, chunk_size=4, sinks=2, window=16, refresh_every=12, full_layers=1)
AUTO_SCRIPT = [(("draft", "target"), (4,)), (("draft", "retrieval", "target"), (2, 4)), (("target",), ()),
               (("retrieval", "target"), (3,))]
CONFIGS = {"ar": dict(mode="ar"), "draft": dict(mode="draft"), "retrieval": dict(mode="retrieval"),
           "retrieval-dynamic": dict(mode="retrieval", retrieval_policy="dynamic"),
           "triforce": dict(mode="triforce"), "triforce-tree": dict(mode="triforce", tree1=6),
           "retrieval-tree": dict(mode="retrieval", tree2=6), "auto": dict(mode="auto")}


@pytest.fixture(scope="module")
def models(tiny_dir):
    target = load_model(tiny_dir("engine-target", seed=11, num_layers=3, scale=25))
    draft = load_model(tiny_dir("engine-draft", seed=12, num_layers=1, scale=25))
    return target, draft


def generate(target, draft, config, prompt, params):
    cfg = EngineConfig(**{**SETTINGS, **config})
    engine = build_engine(cfg, target, draft, len(prompt) + params.max_tokens)
    if cfg.mode == "auto":
        follow_script(engine, cfg.budget, AUTO_SCRIPT)
    tokens, metrics = engine.generate(prompt, params)
    return tokens, engine.logprobs, metrics


# float32 log-probabilities against float64's: at these logits (scale 25) a float32 forward of all rows
# errs by up to 2e-4, one step or check of a few rows through the float32 linear kernel by up to 8e-5
# (its sums run in another order than torch's product, so the two float32 answers differ by their sum)
ATOL = 3e-4


def target_logprobs(target, prompt, tokens):
    """log softmax of one forward of the target over prompt + tokens, at the rows that chose `tokens`; in
    float64, the numbers every float32 path approximates."""
    target = copy.deepcopy(target).to(torch.float64)
    ids = prompt + tokens
    cache = FullKVCache(target.config, len(ids), target.dtype, "cpu")
    logits = target.forward(torch.tensor(ids), cache)
    return torch.log_softmax(logits[len(prompt) - 1:-1], dim=-1).float()


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("params", [SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, logprobs=3),
                                    SamplingParams(max_tokens=40, temperature=0.8, top_p=0.9, seed=5,
                                                   ignore_eos=True, logprobs=3)], ids=["greedy", "sampled"])
def test_logprobs_are_the_targets_own_in_every_mode(models, name, params):
    target, draft = models
    prompt = torch.randint(3, 96, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    tokens, logprobs, metrics = generate(target, draft, CONFIGS[name], prompt, params)
    if params.greedy:
        assert tokens == generate(target, draft, CONFIGS["ar"], prompt, params)[0]
    if name != "ar":
        assert metrics.tiers and all(t.checks > 0 for t in metrics.tiers)  # speculation really ran
    reference = target_logprobs(target, prompt, tokens)  # [n, V]
    assert [lp.token for lp in logprobs] == tokens
    got = torch.tensor([lp.logprob for lp in logprobs])
    torch.testing.assert_close(got, reference[torch.arange(len(tokens)), torch.tensor(tokens)], atol=ATOL, rtol=0)
    values, ids = reference.topk(3, dim=-1)
    assert [[t for t, _ in lp.top] for lp in logprobs] == ids.tolist()
    torch.testing.assert_close(torch.tensor([[v for _, v in lp.top] for lp in logprobs]), values, atol=ATOL, rtol=0)
    chosen = reference[torch.arange(len(tokens)), torch.tensor(tokens)]
    assert [lp.rank for lp in logprobs] == (reference >= chosen[:, None]).sum(-1).tolist()
    assert params.greedy or any(lp.rank > 1 for lp in logprobs)  # a sampled run picks a less likely token


def test_an_entry_reads_as_vllms_dict_of_logprobs(models):
    """As vLLM's {token id: Logprob(logprob, rank)}: the chosen token first, then the k most likely not
    already there, each with its rank; what evaluation code written for vLLM reads."""
    target, draft = models
    prompt = list(range(3, 60))
    params = SamplingParams(max_tokens=30, temperature=1.0, seed=2, ignore_eos=True, logprobs=3)
    tokens, logprobs, _ = generate(target, draft, CONFIGS["triforce"], prompt, params)
    for token, entry in zip(tokens, logprobs):
        top_ids = [t for t, _ in entry.top]
        assert list(entry) == [token] + [t for t in top_ids if t != token]
        assert len(entry) == 3 + (token not in top_ids) and token in entry and entry.get(-1) is None
        assert (entry[token].logprob, entry[token].rank) == (entry.logprob, entry.rank)
        assert [entry[t].rank for t in top_ids] == [1, 2, 3]
        assert [entry[t].logprob for t in top_ids] == [v for _, v in entry.top]
        assert max(entry, key=lambda t: entry[t].logprob) == top_ids[0]
        assert entry == dict(entry) and dict(entry) == entry  # vLLM's is a dict
    assert any(token not in [t for t, _ in e.top] for token, e in zip(tokens, logprobs))  # the k+1 case ran


def test_no_logprobs_unless_asked_and_zero_lists_none_beside(models):
    target, draft = models
    prompt = list(range(3, 60))
    _, logprobs, _ = generate(target, draft, CONFIGS["triforce"], prompt, SamplingParams(max_tokens=8, ignore_eos=True))
    assert logprobs == []
    tokens, logprobs, _ = generate(target, draft, CONFIGS["triforce"], prompt,
                                   SamplingParams(max_tokens=8, ignore_eos=True, logprobs=0))
    assert len(logprobs) == len(tokens) == 8 and all(lp.top == [] for lp in logprobs)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_bad_logprobs_are_refused(bad):
    with pytest.raises(ConfigError, match="logprobs"):
        SamplingParams(logprobs=bad)


@pytest.mark.parametrize("name", ["ar", "triforce", "auto"])
def test_prompt_logprobs_are_the_targets_over_the_prompt_even_where_a_prefix_store_holds_it(models, name):
    """With prompt_logprobs the target scores every prompt token but the first while it prefills: its rows
    equal one forward over the prompt, also when a prefix store holds the prompt's blocks (they are run, not
    restored), and max_tokens may be 0 (scoring only)."""
    from triforce.cache.prefixes import PrefixStore

    target, draft = models
    prompt = torch.randint(3, 96, (150,), generator=torch.Generator().manual_seed(2)).tolist()
    cfg = EngineConfig(**{**SETTINGS, **CONFIGS[name], "prefill_chunk": 32})
    store = PrefixStore(2**24, 32)
    reference = target_logprobs(target, prompt[:1], prompt[1:])

    def generate_with_the_store(params):
        engine = build_engine(cfg, target, draft, len(prompt) + params.max_tokens, prefixes=store)
        if cfg.mode == "auto":
            follow_script(engine, cfg.budget, AUTO_SCRIPT)
        tokens, metrics = engine.generate(prompt, params)
        return engine, tokens, metrics

    plain = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    generate_with_the_store(plain)  # stores the prompt's blocks
    assert generate_with_the_store(plain)[2].cached_prompt_tokens == 128  # and a plain request restores them
    for max_tokens in (6, 0):
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, prompt_logprobs=2)
        engine, tokens, metrics = generate_with_the_store(params)
        assert len(tokens) == max_tokens and engine.prompt_logprobs[0] is None
        assert metrics.cached_prompt_tokens == 0  # nothing restored
        entries = engine.prompt_logprobs[1:]
        assert [e.token for e in entries] == prompt[1:]
        got = torch.tensor([e.logprob for e in entries])
        torch.testing.assert_close(got, reference[torch.arange(149), torch.tensor(prompt[1:])], atol=ATOL, rtol=0)
        assert [[t for t, _ in e.top] for e in entries] == reference.topk(2, dim=-1).indices.tolist()


def test_max_tokens_zero_prefills_only_the_target(models):
    """A request of no new tokens (a prompt scored, or kept for reuse) runs no draft or retrieval tier."""
    target, draft = models
    prompt = list(range(3, 90))
    engine = build_engine(EngineConfig(**{**SETTINGS, **CONFIGS["triforce"]}), target, draft, len(prompt))
    tokens, _ = engine.generate(prompt, SamplingParams(max_tokens=0, prompt_logprobs=0))
    assert tokens == [] and len(engine.prompt_logprobs) == len(prompt)
    assert [t.length for t in engine.tiers] == [0, 0, len(prompt) - 1]  # draft, retrieval, target


@pytest.mark.parametrize("bad", [dict(max_tokens=-1), dict(logprobs=21), dict(prompt_logprobs=-1),
                                 dict(logit_bias={5.7: 1.0}), dict(logit_bias={True: 1.0}),
                                 dict(logit_bias={3: 101})])
def test_bad_counts_are_refused(bad):
    with pytest.raises(ConfigError, match=next(iter(bad))):
        SamplingParams(**bad)


def test_a_token_tied_with_others_ranks_behind_them_as_in_vllm():
    """vLLM ranks the chosen token by how many tokens are as likely or more, itself included: of two
    equal logits at the top, either one is rank 2."""
    from triforce.logprobs import token_logprobs

    rows = torch.tensor([[1.0, 3.0, 3.0, 0.5], [1.0, 3.0, 3.0, 0.5], [1.0, 3.0, 2.0, 0.5]])
    assert [lp.rank for lp in token_logprobs(rows, [1, 2, 1], 0)] == [2, 2, 1]
    assert [lp.rank for lp in token_logprobs(rows, [0, 3, 3], 0)] == [3, 4, 4]



def test_a_checks_rows_score_as_one_token_steps_score_them(two_threads):
    """A check's log-probabilities are those of plain decoding's steps bit for bit, whatever rows share the
    call: with two threads torch's logsumexp splits a lone row of a real vocabulary's size between them, and
    summed it in another order than a row of [n, V] (21 of 100 random [8, 49152] tensors differed)."""
    from triforce.logprobs import token_logprobs

    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        rows = torch.randn(8, 49152, generator=g) * 5
        tokens = torch.randint(0, 49152, (8,), generator=g).tolist()
        together = token_logprobs(rows, tokens, 2)
        alone = [token_logprobs(rows[i:i + 1], tokens[i:i + 1], 2)[0] for i in range(8)]
        assert [(t.logprob, t.top) for t in together] == [(t.logprob, t.top) for t in alone], seed
