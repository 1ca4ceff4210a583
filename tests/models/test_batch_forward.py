"""A batched forward (LlamaModel.forward_batch) against each of its sequences run alone."""
import pytest
import torch

from triforce.cache.full import FullKVCache
from triforce.cache.retrieval import LocalKVSource, RetrievalKVCache
from triforce.cache.streaming import StreamingKVCache
from triforce.models.loader import load_model
from triforce.step import Step


def caches_for(model, kind):
    cfg = model.config
    if kind == "full":
        return FullKVCache(cfg, 96, model.dtype, "cpu"), None
    if kind == "streaming":
        return StreamingKVCache(cfg, 2, 8, 16, model.rope, model.dtype, "cpu"), None
    full = FullKVCache(cfg, 96, model.dtype, "cpu")
    return RetrievalKVCache(LocalKVSource(full), 8, 4, kind, full_layers=0, refresh_every=8, max_speculative=16), full


def run(model, prompts, steps_per_round, batched):
    """Prefill each prompt, then rounds of one step per sequence (a chain or a tree); batched or one by one.
    Returns every round's logits per sequence."""
    out = [[] for _ in prompts]
    pairs = [caches_for(model, kind) for kind, _ in prompts]
    for (cache, full), (kind, prompt) in zip(pairs, prompts):
        model(prompt, full if full is not None else cache, logits_for="none")
        if full is not None:
            cache.sync()
    for round_steps in steps_per_round:
        steps = [make(cache.length) for make, (cache, _) in zip(round_steps, pairs)]
        caches = [cache for cache, _ in pairs]
        logits = model.forward_batch(steps, caches) if batched else [model(s, c) for s, c in zip(steps, caches)]
        for i, l in enumerate(logits):
            out[i].append(l)
        for cache, _ in pairs:
            cache.rollback(0)
    return out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_batch_gives_each_sequence_its_own_logits(tiny_dir, dtype):
    model = load_model(tiny_dir("batch", hidden_size=128, num_heads=4, num_kv_heads=2, num_layers=3), dtype)
    g = torch.Generator().manual_seed(1)
    ids = lambda n: torch.randint(3, 96, (n,), generator=g)  # noqa: E731
    prompts = [("full", ids(20)), ("streaming", ids(33)), ("static", ids(40)), ("dynamic", ids(44))]
    toks = [ids(5) for _ in range(8)]
    rounds = [
        [lambda s, t=toks[0]: Step.chain(t[:1], s), lambda s, t=toks[1]: Step.chain(t[:3], s),
         lambda s, t=toks[2]: Step.tree(t[:4], [-1, 0, 0, 1], s), lambda s, t=toks[3]: Step.chain(t[:2], s)],
        [lambda s, t=toks[4]: Step.tree(t[:5], [-1, -1, 0, 1, 2], s), lambda s, t=toks[5]: Step.chain(t[:1], s),
         lambda s, t=toks[6]: Step.chain(t[:1], s), lambda s, t=toks[7]: Step.tree(t[:3], [-1, 0, 0], s)],
    ]
    alone, together = run(model, prompts, rounds, False), run(model, prompts, rounds, True)
    tol = 1e-5 if dtype == "float32" else 2e-2
    for seq_alone, seq_together in zip(alone, together):
        for a, b in zip(seq_alone, seq_together):
            assert a.shape == b.shape
            torch.testing.assert_close(b, a, atol=tol * a.abs().max().item(), rtol=0)


def test_a_batch_checks_its_inputs(tiny_dir):
    model = load_model(tiny_dir("batch", hidden_size=128, num_heads=4, num_kv_heads=2, num_layers=3))
    cache, _ = caches_for(model, "full")
    with pytest.raises(ValueError, match="one cache per step"):
        model.forward_batch([Step.chain([3], 0), Step.chain([4], 0)], [cache])
    last = model.forward_batch([Step.chain([3, 4, 5], 0)], [cache], logits_for="last")
    assert last[0].shape == (1, model.config.vocab_size)
