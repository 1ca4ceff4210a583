"""Lossless while the retrieval tier really selects chunks.

The target has 3 layers, `full_layers` is 0 and the prompt is 80 tokens against a budget of 12 (3 of 20
chunks per layer and KV head), so every layer of the retrieval tier attends over chosen chunks; its
queries and keys are sharpened so that which chunks it chooses changes its distribution.

- Exactness needs the distribution a tier reports for a position to be independent of the proposals it
  checks (speculation/verify.py): tested directly on the retrieval cache, for both policies.
- The first sampled token follows the target's distribution (triforce under both policies, top-k and
  top-p, a tree at each boundary; the two-token tests of test_engine.py run every mode x policy with real
  selection, with fewer runs): chi-square at alpha = 1e-3 over seeded runs. A shift of 0.02 in total
  variation between two tokens of probability q has noncentrality N * 0.0008 / q: with 6,000 runs
  (triforce, dynamic) the power is 0.9 for q = 0.15 and 0.99 for q = 0.1; with 4,000, 0.9 for q = 0.1;
  with 3,000, 0.72 for q = 0.1. On the old dynamic policy (chunks chosen from all rows' queries) the
  direct test and the triforce, dynamic, top-k + top-p case fail (p = 7e-6 there).
"""
import itertools

import pytest
import torch
from scipy.stats import chisquare

from sampling_runs import outputs
import triforce.cache.retrieval as retrieval
import triforce.kernels.attention as attention_module
from triforce.cache.full import FullKVCache
from triforce.cache.retrieval import LocalKVSource, RetrievalKVCache
from triforce.config import EngineConfig
from triforce.sampling_params import SamplingParams
from triforce.coordinator.hierarchy import build_engine
from triforce.models.loader import load_model
from triforce.speculation.sampling import probabilities

ALPHA = 1e-3
VOCAB, PROMPT_LEN = 8, 80
SETTINGS = dict(budget=12, chunk_size=4, full_layers=0, sinks=2, window=64, refresh_every=12, gamma1=2, gamma2=1)


def sharpen_attention(model, factor: float):
    """Scales the query and key projections: sharper attention, so the chosen chunks matter."""
    for layer in model.layers:
        rows = (layer.num_heads + layer.num_kv_heads) * layer.head_dim
        layer.qkv_proj.weight[:rows] *= factor
    return model


@pytest.fixture(scope="module")
def models(tiny_dir):
    spec = dict(vocab_size=VOCAB, hidden_size=64, num_heads=4, num_kv_heads=2, scale=4)
    target = sharpen_attention(load_model(tiny_dir("select-target", seed=40, num_layers=3, **spec)), 3.0)
    draft = load_model(tiny_dir("select-draft", seed=41, num_layers=1, **spec))
    return target, draft


@pytest.fixture(scope="module")
def prompt():
    return torch.randint(0, VOCAB, (PROMPT_LEN,), generator=torch.Generator().manual_seed(4)).tolist()


@pytest.fixture
def selections(monkeypatch):
    """Counts the retrieval cache's chunk choices that left chunks out."""
    calls = []
    real = retrieval.select_chunks

    def counting(queries, mean_keys, num_chunks):
        calls.append(num_chunks < mean_keys.shape[-2])
        return real(queries, mean_keys, num_chunks)

    monkeypatch.setattr(retrieval, "select_chunks", counting)
    return calls


@pytest.mark.parametrize("attention_path", ["dense", "split"])
@pytest.mark.parametrize("policy", ["static", "dynamic"])
def test_reported_distribution_ignores_the_proposals_it_checks(models, prompt, policy, selections, attention_path,
                                                              monkeypatch):
    """Row i of a check (the distribution of proposal i's position) must be the same whatever the proposals
    from i on are: the old dynamic policy chose chunks from all rows' queries and failed this. Both float32
    attention paths (one masked pass for small masks, the split flash passes for large ones) keep it."""
    monkeypatch.setattr(attention_module, "DENSE_MASK_ENTRIES", 1 << 62 if attention_path == "dense" else 0)
    target, _ = models
    full = FullKVCache(target.config, 128, target.dtype, "cpu")
    target(torch.tensor(prompt[:-1]), full, logits_for="none")
    target(torch.tensor(prompt[-1:]), full, logits_for="none")  # the target's last query: the static choice
    full.rollback(1)
    cache = RetrievalKVCache(LocalKVSource(full), SETTINGS["budget"], SETTINGS["chunk_size"], policy)
    cache.sync()
    logits = {}
    for proposals in itertools.product(range(VOCAB), repeat=2):
        logits[proposals] = target(torch.tensor([prompt[-1], *proposals]), cache)
        cache.rollback(3)
    assert any(selections), "the retrieval cache never left a chunk out"
    for (first, second), rows in logits.items():
        assert torch.equal(rows[0], logits[(0, 0)][0])  # row 0 ignores both proposals
        assert torch.equal(rows[1], logits[(first, 0)][1])  # row 1 sees the first, ignores the second


def first_token_counts(cfg, target, draft, prompt, sampling, trials):
    def run(seed):
        params = SamplingParams(max_tokens=1, ignore_eos=True, seed=seed, **sampling)
        return build_engine(cfg, target, draft, len(prompt) + 1).run(prompt, params)

    counts = torch.zeros(VOCAB)
    for tokens in outputs(run, range(trials)):
        counts[tokens[0]] += 1
    return counts


CASES = [
    # the target's check after two tier-2 checks, not after gamma2 tokens (gamma2 back at its default: unused)
    ("triforce", "static", dict(temperature=1.0), 4000, dict(rounds2=2, gamma2=6)),
    ("triforce", "dynamic", dict(temperature=1.0), 6000, {}),
    ("triforce", "dynamic", dict(temperature=1.0, top_k=6, top_p=0.9), 3000, {}),
    # token trees: the draft's to the retrieval tier, the retrieval tier's to the target
    ("triforce", "static", dict(temperature=1.0), 3000, dict(tree1=6)),
    ("retrieval", "dynamic", dict(temperature=1.0, top_k=6), 3000, dict(tree2=6)),
    # the draft `self`: the target's own model object over the streaming cache (sinks 2 + window 64 of 80
    # tokens: it leaves some out), checked by that object over the retrieval cache, then over the full one
    ("triforce", "static", dict(temperature=1.0, top_p=0.9), 3000, dict(draft="self")),
]


@pytest.mark.parametrize("mode,policy,sampling,trials,extra", CASES)
def test_first_token_follows_the_target_with_real_selection(models, prompt, mode, policy, sampling, trials, extra,
                                                           selections):
    target, draft = models
    if extra.get("draft") == "self":  # (the model object the target runs, not an engine setting)
        extra, draft = {}, target
    cache = FullKVCache(target.config, len(prompt), target.dtype, "cpu")
    logits = target(torch.tensor(prompt), cache, logits_for="last")
    expected = probabilities(logits, sampling["temperature"], sampling.get("top_k", 0), sampling.get("top_p", 1.0))[0]
    cfg = EngineConfig(mode=mode, retrieval_policy=policy, **{**SETTINGS, **extra})
    counts = first_token_counts(cfg, target, draft, prompt, sampling, trials)
    assert mode == "draft" or any(selections), "the retrieval cache never left a chunk out"
    assert torch.all(counts[expected == 0] == 0), "sampled a token the target gives probability 0"
    support = expected > 0
    wanted = expected[support].double() / expected[support].double().sum() * trials  # float32 sums to 1 roughly
    assert chisquare(counts[support].double().numpy(), wanted.numpy()).pvalue > ALPHA


@pytest.fixture(scope="module")
def periodic_prompt():
    """A block of 16 random tokens five times: nearly every 3-gram's latest earlier occurrence is
    followed by the token that follows it now, so the prompt lookup's weight nears 1."""
    block = torch.randint(0, VOCAB, (16,), generator=torch.Generator().manual_seed(9)).tolist()
    return (block * 6)[:PROMPT_LEN]


LOOKUP_CASES = [
    ("triforce", "static", dict(temperature=1.0), 3000),
    ("retrieval", "dynamic", dict(temperature=1.0, top_k=6), 2000),
    ("draft", "static", dict(temperature=1.0, top_p=0.8), 2000),
]


@pytest.mark.parametrize("mode,policy,sampling,trials", LOOKUP_CASES)
def test_first_token_follows_the_target_with_prompt_lookup(models, periodic_prompt, mode, policy, sampling, trials,
                                                          selections):
    """The bottom tier proposes from its distribution mixed with the lookup's copy (speculation/lookup.py),
    here with weight above 0.8, while the target does not continue the period: copies are proposed far more
    often than the target samples them, and only exact checks against the mixture keep the output right."""
    target, draft = models
    prompt = periodic_prompt
    cfg = EngineConfig(mode=mode, retrieval_policy=policy, lookup=3, **SETTINGS)
    probe = build_engine(cfg, target, draft, len(prompt) + 1)
    metrics = probe.generate(prompt, SamplingParams(max_tokens=1, ignore_eos=True, seed=0, **sampling))[1]
    assert metrics.lookup["weight"] > 0.8 and metrics.lookup["candidates"] > 60
    cache = FullKVCache(target.config, len(prompt), target.dtype, "cpu")
    logits = target(torch.tensor(prompt), cache, logits_for="last")
    expected = probabilities(logits, sampling["temperature"], sampling.get("top_k", 0), sampling.get("top_p", 1.0))[0]
    copy = prompt[len(prompt) - 16]  # what the period continues with
    assert expected[copy] < 0.5, "the target continues the period: the lookup would be right anyway"
    counts = first_token_counts(cfg, target, draft, prompt, sampling, trials)
    assert mode == "draft" or any(selections), "the retrieval cache never left a chunk out"
    assert torch.all(counts[expected == 0] == 0), "sampled a token the target gives probability 0"
    support = expected > 0
    wanted = expected[support].double() / expected[support].double().sum() * trials
    assert chisquare(counts[support].double().numpy(), wanted.numpy()).pvalue > ALPHA
