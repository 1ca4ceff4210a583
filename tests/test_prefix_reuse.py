"""Long-document prefix reuse (cache/prefixes.py): a prompt that begins with a recently prefilled one
restores the target's KV of the shared blocks instead of prefilling them, and its output is a cold run's,
in every mode; the store keeps shared blocks once and evicts the least recently used."""
import logging

import pytest
import torch

from mode_settings import for_mode
from triforce import LLM, SamplingParams
from triforce.config import MODES_WITH_DRAFT
from triforce.cache.full import FullKVCache
from triforce.cache.prefixes import PrefixStore

DOCUMENT = [3 + (11 * i + i * i) % 90 for i in range(300)]
# the last one ends the prompt's first 320 tokens on a block boundary (the engine prefills all but the last)
QUESTIONS = [[5, 6, 7, 8, 9], [40, 41, 42], [70, 71, 72, 73, 74, 75, 76], list(range(20, 41))]
GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


def reusable(store: PrefixStore, tokens: list[int]) -> list[bytes]:
    return store.names(tokens, store.reusable_blocks(tokens))


def restore(store: PrefixStore, tokens: list[int], cache) -> int:
    """The stored blocks `tokens` begins with, written into the empty `cache`, as a verifier's prefill
    restores them; -> tokens restored."""
    names, found = reusable(store, tokens), 0
    while found < len(names) and store.restore_block(names, found, cache):
        found += 1
    return found * store.block


def store_prompt(store: PrefixStore, tokens: list[int], cache) -> None:
    """Every whole block of `tokens` that `cache` holds, stored in order as a verifier's prefill does."""
    names = store.names(tokens, min(len(tokens), cache.length) // store.block)
    for i in range(len(names)):
        store.store_block(names, i, cache)


@pytest.fixture(scope="module")
def models(tiny_dir):
    return (tiny_dir("prefix-target", seed=91, num_layers=3, scale=25, max_position_embeddings=2048),
            tiny_dir("prefix-draft", seed=92, num_layers=1, scale=25))


def make(models, mode, gb, **settings):
    target, draft = models
    return LLM(target, draft if mode in MODES_WITH_DRAFT else None, mode=mode, dtype="float32", prefill_chunk=64,
               prefix_cache_gb=gb, **for_mode(mode, dict(budget=32, chunk_size=4, sinks=4, window=32, full_layers=0,
                                                         **settings)))


@pytest.mark.parametrize("mode", ["ar", "triforce", "retrieval", "auto"])
def test_questions_about_one_document_equal_cold_runs(models, mode):
    cold = make(models, mode, 0)
    warm = make(models, mode, 1.0)
    assert cold.prefixes is None
    for i, question in enumerate(QUESTIONS):
        prompt = DOCUMENT + question
        expected = cold.generate(prompt, GREEDY)[0]
        got = warm.generate(prompt, GREEDY)[0]
        assert got.token_ids == expected.token_ids
        # The first prompt prefills everything; later ones restore the document's whole 64-token blocks.
        assert got.metrics.cached_prompt_tokens == (0 if i == 0 else 256)
        assert expected.metrics.cached_prompt_tokens == 0


def test_a_document_evicted_under_the_bound_is_prefilled_again_and_equals_cold_runs(models):
    """A bound of five blocks: a second document's four blocks evict the first's deep blocks, least
    recently used first; asked again, the first document restores what is left (its first block),
    prefills and stores the rest (evicting the second's in turn), and every output is the cold run's."""
    cold = make(models, "triforce", 0)
    block_bytes = cold.target.config.kv_bytes_per_token(4) * 64
    warm = make(models, "triforce", 5 * block_bytes / 2**30)
    other = [3 + (7 * i + 5) % 90 for i in range(300)]
    asks = [(DOCUMENT, 0), (other, 0), (DOCUMENT, 64), (other, 64)]
    for document, cached in asks:
        prompt = document + QUESTIONS[0]
        got = warm.generate(prompt, GREEDY)[0]
        assert got.token_ids == cold.generate(prompt, GREEDY)[0].token_ids
        assert got.metrics.cached_prompt_tokens == cached
        assert warm.prefixes.bytes <= 5 * block_bytes


def test_prompts_of_one_batch_restore_and_equal_cold_runs(models):
    cold, warm = make(models, "triforce", 0), make(models, "triforce", 1.0)
    warm.generate(DOCUMENT + QUESTIONS[0], GREEDY)
    prompts = [DOCUMENT + q for q in QUESTIONS[1:]]
    got = warm.generate(prompts, GREEDY)
    assert [o.metrics.cached_prompt_tokens for o in got] == [256] * len(prompts)
    assert [o.token_ids for o in got] == [o.token_ids for o in cold.generate(prompts, GREEDY)]


@pytest.mark.parametrize("mode", ["ar", "triforce", "auto"])
def test_questions_in_one_batch_prefill_the_document_once(models, mode):
    """Arriving together, the first prompt prefills each document block under its claim and the others
    wait for it and restore it, one block behind: the target runs the document's chunks once."""
    cold, warm = make(models, mode, 0), make(models, mode, 1.0)
    prompts = [DOCUMENT + q for q in QUESTIONS]
    calls = forward_log(warm)
    got = warm.generate(prompts, GREEDY)
    prefilled = [n for call in calls for n, want in call if want == "none"]
    assert [o.metrics.cached_prompt_tokens for o in got] == [0] + [256] * (len(prompts) - 1)
    # the document's 4 blocks once, then each prompt's tail past them (all but its last token)
    assert prefilled == [64] * 4 + [len(p) - 1 - 256 for p in prompts]
    assert [o.token_ids for o in got] == [o.token_ids for o in cold.generate(prompts, GREEDY)]
    assert not warm.prefixes.claims


def forward_log(llm) -> list[list[tuple[int, str]]]:
    """Each call of the target's weights from now on (target and retrieval tiers): (rows, logits wanted)
    of every sequence in it; a prefill chunk wants none."""
    calls, forward = [], llm.target.forward_batch

    def logging(steps, caches, logits_for="all", *args, **kwargs):
        wanted = logits_for if isinstance(logits_for, list) else [logits_for] * len(steps)
        calls.append([(step.n, want) for step, want in zip(steps, wanted)])
        return forward(steps, caches, logits_for, *args, **kwargs)

    llm.target.forward_batch = logging
    return calls


def test_a_claim_whose_owner_went_away_does_not_stall_a_batch(models):
    """A prefill that stopped between chunks (a request cancelled there) leaves no claim behind; one left
    anyway (an owner never closed) is dropped when no forward of its owner is in the batch."""
    from triforce.request import Request
    from triforce.coordinator.batch import SequenceBatch

    cold, warm = make(models, "triforce", 0), make(models, "triforce", 1.0)
    prompt = DOCUMENT + QUESTIONS[0]
    request, batch = Request(warm, prompt, GREEDY, None), SequenceBatch()
    batch.add(request.run())
    assert len(warm.prefixes.claims) == 1  # its first block, being prefilled
    request.cancel()
    batch.run()  # the first block's forward runs, and it is stored; the request ends before the second
    assert not warm.prefixes.claims and len(warm.prefixes.blocks) == 1
    names = reusable(warm.prefixes, prompt[:-1])
    warm.prefixes.claim(names[1], object())  # an owner that will never store it
    # beside a sequence that keeps running (another prompt, decoding long), the claim is dropped at once, not
    # when that sequence ends: the prompt's second block is prefilled before the other's last check
    other = [90 - t for t in DOCUMENT[:40]]
    calls = forward_log(warm)
    got, _ = warm.generate([prompt, other], [GREEDY, SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)])
    first_block = next(i for i, call in enumerate(calls) if (64, "none") in call)
    last_check = max(i for i, call in enumerate(calls) if any(want != "none" for _, want in call))
    assert first_block < last_check / 4
    assert got.token_ids == cold.generate(prompt, GREEDY)[0].token_ids
    assert not warm.prefixes.claims and got.metrics.cached_prompt_tokens == 64


def test_sampled_output_with_a_seed_equals_the_cold_run(models):
    cold, warm = make(models, "triforce", 0), make(models, "triforce", 1.0)
    params = SamplingParams(max_tokens=24, temperature=0.8, seed=5, ignore_eos=True)
    warm.generate(DOCUMENT + QUESTIONS[0], params)
    prompt = DOCUMENT + QUESTIONS[1]
    got = warm.generate(prompt, params)[0]
    assert got.metrics.cached_prompt_tokens == 256
    assert got.token_ids == cold.generate(prompt, params)[0].token_ids


def test_restored_keys_and_values_are_the_prefilled_ones_bit_for_bit(models):
    llm = make(models, "ar", 1.0)
    llm.generate(DOCUMENT + QUESTIONS[0], GREEDY)
    cfg = llm.target.config
    fresh = FullKVCache(cfg, 400, torch.float32, llm.target.device)
    assert restore(llm.prefixes, DOCUMENT + QUESTIONS[2], fresh) == 256 and fresh.length == 256
    cold = FullKVCache(cfg, 400, torch.float32, llm.target.device)
    from triforce.coordinator.tiers import Tier

    Tier("target", llm.target, cold, 64).prefill(DOCUMENT)
    assert torch.equal(fresh.keys[:, :, :256], cold.keys[:, :, :256])
    assert torch.equal(fresh.values[:, :, :256], cold.values[:, :, :256])


def test_a_prompt_that_differs_early_reuses_only_the_blocks_before_the_difference(models):
    llm = make(models, "ar", 1.0)
    llm.generate(DOCUMENT + QUESTIONS[0], GREEDY)
    changed = list(DOCUMENT)
    changed[150] = 4  # in the third block
    out = llm.generate(changed + QUESTIONS[0], GREEDY)[0]
    assert out.metrics.cached_prompt_tokens == 128
    assert out.token_ids == make(models, "ar", 0).generate(changed + QUESTIONS[0], GREEDY)[0].token_ids


def test_shared_blocks_are_held_once_and_least_recently_used_go_first():
    block = 4
    class Cache:  # read() as FullKVCache's, of keys and values that hold their token ids
        def __init__(self, tokens):
            self.length = len(tokens)
            self.keys = torch.tensor(tokens, dtype=torch.float32).view(1, 1, -1, 1).expand(2, 1, -1, 4).clone()

        def read(self, start, n):
            return self.keys[:, :, start:start + n].clone(), self.keys[:, :, start:start + n].clone()

        def block_bytes(self, n):
            return 2 * self.keys[:, :, :n].numel() * 4

    block_bytes = 2 * 1 * block * 4 * 4 * 2  # keys and values of one block, float32
    store = PrefixStore(max_bytes=5 * block_bytes, block=block)
    a = list(range(100, 112))  # three blocks
    b = a[:8] + [7, 7, 7, 7]  # shares two blocks with a
    store_prompt(store, a, Cache(a))
    store_prompt(store, b, Cache(b))
    assert len(store.blocks) == 4 and store.bytes == 4 * block_bytes  # a's two shared blocks held once
    c = list(range(200, 212))
    store_prompt(store, c, Cache(c))  # 7 blocks > 5: the two least recently used go (a's last, then b's last)
    assert len(store.blocks) == 5 and store.bytes == 5 * block_bytes

    class Target:
        def __init__(self):
            self.length, self.written = 0, []

        def write(self, start, keys, values):
            self.written.append((start, keys[0, 0, :, 0].tolist()))
            self.length = start + keys.shape[2]

    for prompt, reused in ((a + [1], 8), (b + [1], 8), (c + [1], 12)):
        target = Target()
        assert restore(store, prompt, target) == reused
        assert [tokens for _, tokens in target.written] == [prompt[i:i + block] for i in range(0, reused, block)]
    # Reuse never covers the whole prompt: its last token is always prefilled.
    assert restore(store, c, Target()) == 8

    # A bound of two blocks keeps a prompt's first two; one smaller than a block keeps nothing.
    small = PrefixStore(max_bytes=2 * block_bytes, block=block)
    store_prompt(small, a, Cache(a))
    assert small.bytes == 2 * block_bytes and restore(small, a + [1], Target()) == 8
    tiny = PrefixStore(max_bytes=block_bytes - 1, block=block)
    store_prompt(tiny, a, Cache(a))
    assert tiny.bytes == 0 and restore(tiny, a + [1], Target()) == 0


def test_zero_gigabytes_keeps_no_prefixes_and_a_negative_bound_is_refused(models, caplog):
    assert make(models, "ar", 0).prefixes is None
    with pytest.raises(Exception, match="prefix_cache_gb"):
        make(models, "ar", -1)
    # a bound under one block (64 tokens x 3 layers x 2 KV heads x 16 x 2 x 4 bytes) keeps nothing: said once
    block = 64 * 3 * 2 * 16 * 2 * 4
    for gb, warned in ((block / 2**30, False), ((block - 1) / 2**30, True)):
        caplog.clear()
        make(models, "ar", gb)
        assert ("holds no prompt block" in caplog.text) == warned, caplog.text


def test_the_server_reports_cached_prompt_tokens(models):
    from fastapi.testclient import TestClient

    from triforce.serve.app import create_app

    llm = make(models, "triforce", 1.0)
    with TestClient(create_app(llm, "tiny")) as client:
        bodies = [client.post("/v1/completions", json={"prompt": DOCUMENT + q, "max_tokens": 8, "temperature": 0,
                                                        "ignore_eos": True}).json() for q in QUESTIONS[:2]]
        scored = client.post("/v1/completions", json={"prompt": DOCUMENT, "max_tokens": 1, "prompt_logprobs": 0})
        metrics = client.get("/metrics").text  # (a scored prompt never looks the store up: no queries)
    assert scored.status_code == 200 and scored.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert [b["usage"]["prompt_tokens_details"]["cached_tokens"] for b in bodies] == [0, 256]
    assert 'vllm:prefix_cache_hits_total{model_name="tiny"} 256.0' in metrics
    queries = sum(len(DOCUMENT + q) for q in QUESTIONS[:2])
    assert f'vllm:prefix_cache_queries_total{{model_name="tiny"}} {queries}.0' in metrics


def test_n_choices_prefill_their_prompt_once(models):
    """A request of n = 3 choices: one choice prefills the prompt's whole blocks, the two others wait for
    them and restore them (256 tokens each); usage reports what the store held for every choice (none),
    and each greedy choice is the cold run's."""
    from fastapi.testclient import TestClient

    from triforce.serve.app import create_app

    prompt = DOCUMENT[::-1] + QUESTIONS[0]
    expected = make(models, "triforce", 0).generate(prompt, GREEDY)[0].text
    with TestClient(create_app(make(models, "triforce", 1.0), "tiny")) as client:
        body = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 24, "temperature": 0,
                                                     "ignore_eos": True, "n": 3}).json()
        metrics = client.get("/metrics").text
    assert [c["text"] for c in body["choices"]] == [expected] * 3
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert body["usage"]["completion_tokens"] == 72 and body["usage"]["prompt_tokens"] == len(prompt)
    assert 'vllm:prefix_cache_hits_total{model_name="tiny"} 512.0' in metrics


def test_batch_jobs_reuse_the_document_across_batches(models, tmp_path):
    """At the default prefill chunk (blocks of 512 tokens)."""
    import json

    from triforce.launch.cli import main

    document = DOCUMENT * 4  # 1,200 tokens: two whole blocks
    lines = [json.dumps({"custom_id": str(i), "method": "POST", "url": "/v1/completions",
                         "body": {"prompt": document + q, "max_tokens": 6, "temperature": 0, "ignore_eos": True}})
             for i, q in enumerate(QUESTIONS)]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("\n".join(lines) + "\n")
    argv = ["batch", "--input", str(inp), "--output", str(out), "--model", str(models[0]), "--mode", "ar",
            "--dtype", "float32", "--batch-size", "1"]
    assert main(argv + ["--prefix-cache-gb", "0.5"]) == 0
    cached = {r["custom_id"]: r["response"]["body"]["usage"]["prompt_tokens_details"]["cached_tokens"]
              for r in map(json.loads, out.read_text().splitlines())}
    assert cached == {"0": 0, "1": 1024, "2": 1024, "3": 1024}


def test_admission_leaves_the_store_its_room(models, monkeypatch):
    from triforce import request_memory

    llm = make(models, "ar", 0.25)
    monkeypatch.setattr(request_memory, "available_bytes", lambda device: 2**30)
    assert llm.free_memory() == 2**30 - 2**28
    llm.generate(DOCUMENT + QUESTIONS[0], GREEDY)
    assert 0 < llm.prefixes.bytes and llm.free_memory() == 2**30 - 2**28 + llm.prefixes.bytes


def test_a_server_without_the_store_counts_no_prefix_queries(models):
    from fastapi.testclient import TestClient

    from triforce.serve.app import create_app

    with TestClient(create_app(make(models, "ar", 0), "tiny")) as client:
        client.post("/v1/completions", json={"prompt": DOCUMENT, "max_tokens": 2})
        metrics = client.get("/metrics").text
    assert 'vllm:prefix_cache_queries_total{model_name="tiny"}' not in metrics


def test_a_store_bound_past_the_free_memory_is_refused_and_the_default_capped(models, monkeypatch, caplog):
    """prefix_cache_gb=100 on a 24 GB machine made every request fail as too large for the memory left."""
    from triforce import api, request_memory
    from triforce.config import PREFIX_CACHE_GB

    monkeypatch.setattr(request_memory, "available_bytes", lambda device: 2**30)
    with pytest.raises(api.ConfigError, match="prefix_cache_gb 100 is more than the 1.0 GiB free"):
        make(models, "ar", 100)
    assert make(models, "ar", PREFIX_CACHE_GB).prefixes.max_bytes == 2**29  # half of what is free
    assert make(models, "ar", 0.25).prefixes.max_bytes == 2**28  # as asked
    with caplog.at_level(logging.WARNING, logger="triforce.request_memory"):
        assert make(models, "ar", 0.75).prefixes.max_bytes == 2**29  # half, and said (it was silent)
    assert "prefix store bounded to 0.50 GiB, half the memory free on cpu (0.75 GiB asked)" in caplog.text
