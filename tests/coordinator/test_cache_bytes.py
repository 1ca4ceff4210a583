"""hierarchy.cache_bytes, the memory check's estimate of one request's caches, against the bytes the caches
of a real request hold once it has run (every tier's tensors, each storage counted once), and its rows of
the vocabulary against those alive while the request's tiers check each other."""
import gc
import warnings
from dataclasses import replace

import pytest
import torch
from held_bytes import held_bytes

import triforce.coordinator.batch as batch_module
import triforce.coordinator.tiers as tiers_module
from triforce.cache.full import QUERY_ROWS
from triforce.config import EngineConfig
from triforce.sampling_params import SamplingParams
from triforce.coordinator.hierarchy import (build_engine, cache_bytes, rebuild_bytes, row_bytes,
                                            speculation_slack)
from triforce.models.loader import load_model


# budget 512: a request whose 340 tokens fit the budget, which a static cache reads in place (it counted a
# copy of every layer but the `full_layers` and the chunk means: 1.6 times what such a request holds)
@pytest.mark.parametrize("mode,policy,budget", [("ar", "static", 32), ("draft", "static", 32), ("triforce", "static", 32),
                                                ("triforce", "dynamic", 32), ("auto", "static", 32),
                                                ("auto+self", "static", 32),
                                                ("triforce", "static", 512), ("triforce", "dynamic", 512)])
def test_the_estimate_covers_what_a_request_holds(tiny_dir, mode, policy, budget):
    mode, _, self_draft = mode.partition("+")  # auto+self: with auto_self_draft, a second draft's window
    spec = dict(vocab_size=64, hidden_size=64, num_heads=4, num_kv_heads=2)
    target = load_model(tiny_dir("bytes-target", seed=60, num_layers=4, **spec))
    draft = load_model(tiny_dir("bytes-draft", seed=61, num_layers=1, **spec))
    cfg = EngineConfig(mode=mode, retrieval_policy=policy, budget=budget, chunk_size=8, full_layers=1, sinks=4,
                       window=32, refresh_every=16, auto_self_draft=bool(self_draft))
    prompt = torch.randint(0, 64, (300,), generator=torch.Generator().manual_seed(6)).tolist()
    engine = build_engine(cfg, target, draft if mode != "ar" else None, 300 + 40)
    engine.generate(prompt, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    held = held_bytes([tier.cache for tier in engine.ladder])
    draft_config = draft.config if mode != "ar" else None
    estimate = cache_bytes(cfg, target.config, draft_config, 340, 4) - row_bytes(cfg, target.config, draft_config)
    estimate -= rebuild_bytes(cfg, target.config, 340 + speculation_slack(cfg), 4, remote=False)  # none running
    full = target.config.kv_bytes_per_token(4) * 340
    assert held > (full if mode in ("ar", "auto") else 1.1 * full)  # the other tiers' caches are real bytes too
    if mode == "auto":  # which tiers ran depends on measured times: the estimate covers all of them
        assert estimate >= 0.95 * held, (held, estimate)
        if self_draft:  # and what it adds for the self draft covers that tier's window
            added = cache_bytes(cfg, target.config, draft_config, 340, 4) - \
                cache_bytes(replace(cfg, auto_self_draft=False), target.config, draft_config, 340, 4)
            window = held_bytes([engine.planner.tiers["draft@self"].cache])
            assert window <= added <= 1.5 * window, (window, added)
        return
    # all but small state (positions, RoPE angles), a few percent of this toy cache of 16-wide heads; the
    # estimate holds the target's queries of QUERY_ROWS rows (the fused loop's store, or the layer-by-layer
    # path's after a forward of as many rows), where this request's last forward left a few rows' only
    queries = 4 * 4 * QUERY_ROWS * 16 * 4
    assert 0.95 * held <= estimate - queries <= 1.1 * held, (held, estimate)


def counting_rows(function, vocab: int, most: list[int]):
    """`function`, which first raises most[0] to the bytes of the tensors alive whose last dimension is the
    vocabulary (logits and distributions; the models' weights have the hidden size last), each storage once:
    of those the collector tracks, which under `new_objects_only` are the ones made since."""
    def count_then_call(*args, **kwargs):
        with warnings.catch_warnings():  # (isinstance on some of torch's deprecated objects warns)
            warnings.simplefilter("ignore")
            tensors = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
        most[0] = max(most[0], held_bytes([t for t in tensors if t.dim() >= 1 and t.shape[-1] == vocab]))
        return function(*args, **kwargs)
    return count_then_call


@pytest.fixture
def new_objects_only():
    """Freezes the objects alive (gc.freeze: gc.get_objects leaves them out) until the test ends, so that
    counting_rows walks what the test makes, not all that a suite's worker holds (the triforce case: 17 s
    in a suite's worker, 4 alone; 0.2 s since)."""
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.mark.parametrize("mode", ["ar", "draft", "retrieval", "triforce"])
def test_the_estimate_covers_the_rows_of_the_vocabulary_a_request_holds(tiny_dir, monkeypatch, mode,
                                                                         new_objects_only):
    """At every chain verification (where the checker's rows and the proposals' distributions are all
    alive; in mode ar after every forward), greedy and sampled, the rows of the vocabulary alive stay within
    row_bytes, which is no more than three times the most seen (with a vocabulary of 2,048, these rows
    outweigh this toy request's caches)."""
    vocab = 2048
    spec = dict(vocab_size=vocab, hidden_size=64, num_heads=4, num_kv_heads=2)
    target = load_model(tiny_dir("rows-target", seed=62, num_layers=2, **spec))
    draft = load_model(tiny_dir("rows-draft", seed=63, num_layers=1, **spec))
    most = [0]
    if mode == "ar":  # (no verification: after each forward)
        monkeypatch.setattr(tiers_module, "charge_call", counting_rows(tiers_module.charge_call, vocab, most))
    else:
        monkeypatch.setattr(batch_module, "verify_chains", counting_rows(batch_module.verify_chains, vocab, most))
    cfg = EngineConfig(mode=mode, budget=32, chunk_size=8, full_layers=1, sinks=4, window=32, refresh_every=16)
    with_draft = draft if mode in ("draft", "triforce") else None
    prompt = torch.randint(0, vocab, (200,), generator=torch.Generator().manual_seed(7)).tolist()
    for params in (SamplingParams(max_tokens=16, temperature=0, ignore_eos=True),
                   SamplingParams(max_tokens=16, temperature=0.8, top_p=0.9, seed=3, ignore_eos=True)):
        build_engine(cfg, target, with_draft, 200 + 16).generate(prompt, params)
    estimate = row_bytes(cfg, target.config, draft.config if with_draft is not None else None)
    assert 0 < most[0] <= estimate <= 3 * most[0], (most[0] // (4 * vocab), estimate // (4 * vocab))


def test_the_estimate_covers_the_rows_of_a_scored_prompt_chunk(tiny_dir, monkeypatch, new_objects_only):
    """A prompt scored (prompt_logprobs) brings the target's rows for a whole prefill chunk at once, far more
    than a check's: the estimate holds them (three per token: the logits and logsumexp's temporary, which this
    count at the call does not see, with a margin; before, a batch of scored prompts was sized as if they
    brought none)."""
    import triforce.coordinator.prefill as prefill_module  # (the target scores the prompt as it prefills)

    vocab, chunk = 2048, 128
    spec = dict(vocab_size=vocab, hidden_size=64, num_heads=4, num_kv_heads=2)
    target = load_model(tiny_dir("rows-target", seed=62, num_layers=2, **spec))
    most = [0]
    monkeypatch.setattr(prefill_module, "token_logprobs", counting_rows(prefill_module.token_logprobs, vocab, most))
    cfg = EngineConfig(mode="ar", prefill_chunk=chunk)
    prompt = torch.randint(0, vocab, (300,), generator=torch.Generator().manual_seed(8)).tolist()
    build_engine(cfg, target, None, 300 + 4).generate(prompt, SamplingParams(max_tokens=4, prompt_logprobs=2))
    estimate = row_bytes(cfg, target.config, None, scored_rows=chunk)
    assert 4 * vocab * chunk <= most[0] <= estimate  # a chunk's rows at once
    assert row_bytes(cfg, target.config, None) < 4 * vocab * chunk

