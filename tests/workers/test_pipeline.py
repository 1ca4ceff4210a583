"""The distributed pipeline on CPU: a coordinator (this process, rank 0 of a gloo world) and a worker
group (spawned processes, ranks 1..N) over loopback ZeroMQ, with KV over the bulk link. Greedy tokens
and seeded samples equal the single-process engine's; a dead worker fails the request within the
timeout; bad messages get error replies."""
import signal
import subprocess
import sys
import time

import pytest
import torch
import zmq
from held_bytes import held_bytes
from mode_settings import for_mode
from worker_group import Group

from triforce import LLM
from triforce.config import EngineConfig
from triforce.sampling_params import SamplingParams
from triforce.coordinator.batch import SequenceBatch
from triforce.coordinator.hierarchy import (build_engine, cache_bytes, graph_sizes, rebuild_bytes, row_bytes,
                                            speculation_slack)
from triforce.coordinator.channel import WorkerError
from triforce.coordinator.remote import RemoteVerifier
from triforce.coordinator.verifier import LocalVerifier
from triforce.cache.retrieval import retrieve_from_full
from triforce.models.loader import load_model
from triforce.step import Step, ancestor_mask
from triforce.workers.protocol import PROTOCOL_VERSION, decode, encode, reply

SETTINGS = dict(budget=32, chunk_size=4, sinks=2, window=16, refresh_every=12, full_layers=1)


@pytest.fixture(scope="module")
def models(tiny_dir):
    spec = dict(hidden_size=48, num_heads=12, num_kv_heads=6, seed=70, num_layers=3, scale=25)
    target_dir = tiny_dir("pipe-target", **spec)
    return target_dir, load_model(target_dir), load_model(tiny_dir("pipe-draft", seed=71, num_layers=1, scale=25))


def run(target, draft, mode, prompt, params, verifier=None, **settings):
    cfg = EngineConfig(mode=mode, **{**SETTINGS, **settings})
    return build_engine(cfg, target, draft, len(prompt) + params.max_tokens, verifier).generate(prompt, params)


def capacity(prompt, params) -> int:
    return len(prompt) + params.max_tokens + speculation_slack(EngineConfig(**SETTINGS))


def remote(group, target, prompt, params):
    return RemoteVerifier(group.channel, target, capacity(prompt, params),
                          graph_sizes(EngineConfig(**SETTINGS), group.channel.prefill_chunk))


def batch_over_the_group(group, target, draft, cfg, prompts, params):
    """The prompts as one SequenceBatch whose target verifies on `group`: (the engines, each one's tokens,
    every request sent to the group as (kind, body)); the group frees each sequence after."""
    sent, request = [], group.channel.request
    group.channel.request = lambda kind, body=None, **kw: (sent.append((kind, body)), request(kind, body, **kw))[1]
    verifiers = [remote(group, target, p, sp) for p, sp in zip(prompts, params)]
    engines = [build_engine(cfg, target, draft, len(p) + sp.max_tokens, v)
               for p, sp, v in zip(prompts, params, verifiers)]
    batch = SequenceBatch()
    handles = [batch.add(engine.run(p, sp)) for engine, p, sp in zip(engines, prompts, params)]
    batch.run()
    for verifier in verifiers:
        verifier.close()
    return engines, [h.result[0] for h in handles], sent


def assert_same_logprobs(got, want):
    """Log-probability entries over the group and in one process: the same tokens and top tokens, values
    a few ulps apart (tensor parallelism sums in another order)."""
    assert [(e.token, [t for t, _ in e.top]) for e in got] == [(e.token, [t for t, _ in e.top]) for e in want]
    torch.testing.assert_close(torch.tensor([e.logprob for e in got]), torch.tensor([e.logprob for e in want]),
                               atol=1e-4, rtol=0)


def assert_same_kv(got, expected):
    """Per layer (keys, values) of a remote refresh against one process's: same tokens, same heads."""
    assert len(got) == len(expected)
    for (keys, values), (want_keys, want_values) in zip(got, expected):
        assert keys.shape == want_keys.shape
        # Tensor parallelism sums in another order: a few ulps apart per layer, which 40 layers compound
        # to about 2e-4 on keys of magnitude 1 to 4; another chunk would be O(1) apart.
        torch.testing.assert_close(keys, want_keys, rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(values, want_values, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("workers", [2, 3])
def test_worker_group_reproduces_the_single_process_engine(models, tmp_path, workers):
    folder, target, draft = models
    prompt = torch.randint(3, 96, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    group = Group(folder, workers, tmp_path)
    try:
        for params in (SamplingParams(max_tokens=40, temperature=0, ignore_eos=True),
                       SamplingParams(max_tokens=40, temperature=0.9, seed=4, ignore_eos=True)):
            for mode in ("triforce", "retrieval", "ar"):
                expected, _ = run(target, draft, mode, prompt, params)
                got, metrics = run(target, draft, mode, prompt, params, remote(group, target, prompt, params))
                assert got == expected, (mode, params.temperature)
        stats, _ = group.channel.request("stats")
        assert stats["verified_tokens"] > 0 and stats["errors"] == 0
    finally:
        group.close()


@pytest.mark.parametrize("mode", ["triforce", "ar"])
def test_a_batch_over_the_worker_group_reproduces_each_sequence_alone(models, tmp_path, mode):
    """Three sequences of different lengths and sampling settings in one SequenceBatch, each with its own
    sequence in one worker group: their target checks go out together (one verify request for several
    sequences), and each output equals its single-process run alone, log-probabilities too (from the
    group's rows of the target); the group frees every sequence."""
    folder, target, draft = models
    gen = torch.Generator().manual_seed(9)
    prompts = [torch.randint(3, 96, (n,), generator=gen).tolist() for n in (150, 90, 120)]
    params = [SamplingParams(max_tokens=30, temperature=0, ignore_eos=True, logprobs=2),
              SamplingParams(max_tokens=24, temperature=0.9, seed=5, ignore_eos=True),
              SamplingParams(max_tokens=36, temperature=0.7, top_k=20, seed=6, ignore_eos=True, logprobs=1)]
    cfg = EngineConfig(mode=mode, **SETTINGS)
    alone = [build_engine(cfg, target, draft, len(p) + sp.max_tokens) for p, sp in zip(prompts, params)]
    expected = [engine.generate(p, sp)[0] for engine, p, sp in zip(alone, prompts, params)]
    group = Group(folder, 2, tmp_path)
    try:
        engines, outputs, sent = batch_over_the_group(group, target, draft, cfg, prompts, params)
        assert outputs == expected
        assert [len(e.logprobs) for e in engines] == [30, 0, 36]
        for engine, single in zip(engines, alone):
            assert_same_logprobs(engine.logprobs, single.logprobs)
        verifies = [len(body["seqs"]) for kind, body in sent if kind == "verify"]
        assert max(verifies) == 3  # checked together
        stats, _ = group.channel.request("stats")
        assert stats["sequences"] == 0 and stats["errors"] == 0
    finally:
        group.close()


def test_the_group_restores_a_documents_prompt_blocks_and_outputs_equal_cold_runs(models, tmp_path):
    """Questions about one document, one after another and then two about another document together in
    one batch: the group's prefix store restores the document's whole blocks for every prompt after the
    first, never the block that ends a prompt, and each output equals its single-process run without a
    store (sampled, float32)."""
    folder, target, draft = models
    gen = torch.Generator().manual_seed(12)
    tokens = lambda n: torch.randint(3, 96, (n,), generator=gen).tolist()  # noqa: E731
    document, other = tokens(200), tokens(140)
    # The target prefills all but a prompt's last token (its first check runs that). The document then two
    # questions (3 whole blocks of 64 shared), then its first 193 tokens (3 whole blocks prefilled; the
    # last ends the prefill: forwarded); then two prompts on `other` (2 whole blocks) in one batch.
    one_by_one = [document + tokens(20), document + tokens(30), document[:193]]
    together = [other + tokens(10), other + tokens(25)]
    params = SamplingParams(max_tokens=24, temperature=0.9, seed=3, ignore_eos=True)
    expected = [run(target, draft, "triforce", p, params)[0] for p in one_by_one + together]
    group = Group(folder, 2, tmp_path, prefill_chunk=64, prefix_bytes=2**20)
    try:
        results = [run(target, draft, "triforce", p, params, remote(group, target, p, params))
                   for p in one_by_one]
        cfg = EngineConfig(mode="triforce", **SETTINGS)
        batch = SequenceBatch()
        handles = [batch.add(build_engine(cfg, target, draft, len(p) + params.max_tokens,
                                          remote(group, target, p, params)).run(p, params)) for p in together]
        batch.run()
        results += [h.result for h in handles]
        assert [tokens for tokens, _ in results] == expected
        assert [m.cached_prompt_tokens for _, m in results] == [0, 192, 128, 0, 128]
        stats, _ = group.channel.request("stats")
        prefilled = sum(len(p) - 1 for p in one_by_one + together)
        assert stats["prefilled_tokens"] == prefilled - 448 and stats["errors"] == 0
        # The Python API on the group: LLM(workers=...) keeps no store of its own, the group's serves it, in
        # the group's blocks whatever the coordinator's own prefill chunk.
        llm = LLM(folder, mode="retrieval", dtype="float32", workers=group.channel, budget=32, chunk_size=4,
                  prefill_chunk=48)
        assert llm.reuses_prefixes and llm.prefixes is None and group.channel.prefix_bytes == 2**20
        assert llm.generate([document + tokens(5)], params)[0].metrics.cached_prompt_tokens == 192
    finally:
        group.close()


def test_mode_auto_over_the_worker_group_measures_the_group_apart(models, tmp_path, monkeypatch):
    """Mode auto plans from forward costs measured on this machine: a target behind a worker group is
    measured under its own key (another cost than an in-process target's), and the output equals the
    single-process run's. After a measurement the group's last query is the last prompt token's."""
    from triforce.coordinator.costs import CostTable, forward_seconds, tier_key
    from triforce.kernels.cpu import cpu_model

    monkeypatch.setenv("TRIFORCE_CALIBRATION", "0")  # this process's memory only
    # (forwards 1.5x off the measured costs have the entry forgotten as the request ends, to be measured
    # again: on a machine loaded by the rest of the suite they were once, and the entry looked never made)
    monkeypatch.setattr("triforce.coordinator.forward_times.REMEASURE_BEYOND", float("inf"))
    folder, target, draft = models
    prompt = torch.randint(3, 96, (150,), generator=torch.Generator().manual_seed(5)).tolist()
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)  # auto plans from 32 tokens on
    local = LocalVerifier(target, capacity(prompt, params))  # (a measurement's filler, below)
    local.prefill(prompt)
    chosen = retrieve_from_full(local.cache, 16, 4, 0)
    local.forward(Step.chain([0] * 3, local.length), "all")
    local.truncate(len(prompt))
    assert any(not torch.equal(a, b) for (a, _), (b, _) in zip(chosen, retrieve_from_full(local.cache, 16, 4, 0)))
    group = Group(folder, 2, tmp_path)
    try:
        expected, _ = run(target, draft, "auto", prompt, params)
        verifier = remote(group, target, prompt, params)
        got, _ = run(target, draft, "auto", prompt, params, verifier)
        assert got == expected
        # A measurement's filler forwards, rolled back: the group puts back the last query too, so a refresh
        # right after chooses by the last prompt token's query (by the filler's, other chunks: above)
        measured = remote(group, target, prompt, params)
        measured.prefill(prompt)
        forward_seconds([measured], (3,))
        assert measured.length == len(prompt)
        assert_same_kv(measured.kv_source().retrieve(16, 4, 0), chosen)
        with pytest.raises(WorkerError, match="saved none"):  # one save, one restore
            measured.restore_query_state(measured.seq)
    finally:
        group.close()
    local_key = tier_key(LocalVerifier(target, 64))  # the group's by its ranks' devices, as its handshake told
    group_key = f"{local_key}|workers=2@{group.channel.machine}"
    assert tier_key(verifier) == group_key and group.channel.machine.startswith(cpu_model())
    assert any(f"||{group_key}||" in key for key in CostTable.default().entries)  # auto measured it


def test_a_long_prompt_prefilling_on_the_group_does_not_stall_a_decoding_sequence(models, tmp_path):
    """A prompt's chunks are target forwards in the batch, each sent beside a decoding neighbour's check
    (the group prefills a chunk per request), so the neighbour keeps decoding while a long prompt
    arrives (before, the whole prompt's prefill ran in one go); both outputs equal their runs alone."""
    folder, target, draft = models
    gen = torch.Generator().manual_seed(21)
    decoding, arriving = (torch.randint(3, 96, (n,), generator=gen).tolist() for n in (40, 400))
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    expected = [run(target, draft, "triforce", p, params)[0] for p in (decoding, arriving)]
    group = Group(folder, 2, tmp_path, prefill_chunk=64)
    sent = []
    request = group.channel.request
    group.channel.request = lambda kind, body=None, **kw: (sent.append((kind, body)), request(kind, body, **kw))[1]
    try:
        cfg = EngineConfig(mode="triforce", **SETTINGS)
        engine = lambda p: build_engine(cfg, target, draft, len(p) + params.max_tokens,  # noqa: E731
                                        remote(group, target, p, params)).run(p, params)
        batch = SequenceBatch()
        first = batch.add(engine(decoding))
        while not any(kind == "verify" for kind, _ in sent):
            batch.step()
        second = batch.add(engine(arriving))
        batch.run()
        assert [first.result[0], second.result[0]] == expected
        prefills = [i for i, (kind, body) in enumerate(sent) if kind == "prefill" and len(body["tokens"]) == 64]
        assert len(prefills) == 6  # the arriving prompt's whole chunks
        between = [kind for kind, _ in sent[prefills[0]:prefills[-1]]]
        assert between.count("verify") >= len(prefills) - 1  # the decoding sequence checked beside each chunk
    finally:
        group.close()


def test_a_full_group_runs_a_batch_in_parts_and_a_server_queues_what_it_refused(models, tmp_path):
    """A group that holds two sequences at once: LLM.generate of five prompts runs them in parts as the
    group refuses a sequence for now, and a server keeps a refused request waiting until a running one
    ends; every output equals the one-process run (before, the refusal failed the batch and the request)."""
    import threading

    from triforce.serve.openai import Job
    from triforce.serve.scheduler import Scheduler

    folder = models[0]
    gen = torch.Generator().manual_seed(13)
    prompts = [torch.randint(3, 96, (n,), generator=gen).tolist() for n in (70, 40, 90, 55, 64)]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    settings = dict(mode="triforce", dtype="float32", budget=32, chunk_size=4)
    expected = [out.token_ids for out in LLM(folder, **settings).generate(prompts, params)]
    group = Group(folder, 1, tmp_path, max_sequences=2)
    try:
        llm = LLM(folder, workers=group.channel, **settings)
        assert [out.token_ids for out in llm.generate(prompts, params)] == expected
        refused = group.channel.request("stats")[0]["errors"]
        assert refused == 2  # the third and the fifth prompt: parts of 2, 2 and 1
        scheduler = Scheduler(llm)
        events, done = [], threading.Semaphore(0)
        for i, ids in enumerate(prompts[:3]):
            scheduler.submit(Job("completion", [ids], params, False, False, f"r{i}", 0),
                             lambda kind, data, i=i: kind in ("done", "error") and
                             (events.append((i, kind, data)), done.release()))
        assert all(done.acquire(timeout=60) for _ in range(3))
        scheduler.stop()
        assert sorted((i, kind, data.token_ids) for i, kind, data in events) == \
            [(i, "done", expected[i]) for i in range(3)]
        stats, _ = group.channel.request("stats")
        assert stats["errors"] > refused and stats["sequences"] == 0  # the server's third waited
    finally:
        group.close()


def test_a_cache_another_rank_cannot_allocate_is_refused_and_the_group_goes_on(models, tmp_path):
    """The leader checks its own device's memory; a rank on a fuller or smaller GPU that could not allocate
    its share of a cache died alone, and the group with it (the leader had answered the start as done). Every
    rank now allocates, they agree, and all refuse alike: for now beside other sequences (a batch runs in
    parts, a server waits), for good alone (GroupTooSmall: a 413)."""
    from triforce.coordinator.channel import GroupFull, GroupTooSmall

    folder = models[0]
    group = Group(folder, 2, tmp_path, short_of_memory=(1, 200))
    try:
        start = lambda seq, capacity: group.channel.request(  # noqa: E731
            "start", {"seq": seq, "capacity": capacity, "forwards": [1]})
        with pytest.raises(GroupTooSmall, match="could not be allocated on another rank"):
            start(1, 300)
        start(2, 150)
        with pytest.raises(GroupFull, match="could not be allocated on another rank"):
            start(3, 300)
        body, _ = group.channel.request("prefill", {"seq": 2, "tokens": list(range(3, 40)), "start": 0,
                                                    "final": True})
        stats, _ = group.channel.request("stats")
        assert body["length"] == 37 and stats["sequences"] == 1 and stats["errors"] == 2
        group.channel.request("end", {"seq": 2})
        # a rank that fails otherwise (a bug) ends the group at once, its leader saying so: the leader waited
        # in the ranks' all-reduce for it, and the coordinator for --worker-timeout
        started = time.perf_counter()
        with pytest.raises(WorkerError, match="failed on another rank of the group.*the worker group ends"):
            start(4, 123)
        assert group.channel.broken and time.perf_counter() - started < 30
    finally:
        group.close()


def test_over_a_worker_group_the_memory_check_counts_the_coordinators_own_caches(models, tmp_path):
    """With the target's full cache on the group, this process still holds the draft's caches and the
    retrieval tier's copies (its kept layers whole, since it cannot read them in place): the estimate
    covers what a request's tiers here hold, with a prompt whose context passes the budget and one within
    it (every layer copied whole), and LLM sizes batches by it (before, it checked nothing with workers)."""
    folder, target, draft = models
    cfg = EngineConfig(mode="triforce", **SETTINGS)
    group = Group(folder, 1, tmp_path)
    try:
        params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
        for length in (150, 20):  # budget 32: chunks chosen, then every token kept
            prompt = torch.randint(3, 96, (length,), generator=torch.Generator().manual_seed(length)).tolist()
            verifier = remote(group, target, prompt, params)
            engine = build_engine(cfg, target, draft, length + 12, verifier)
            engine.generate(prompt, params)
            verifier.close()
            held = held_bytes([tier.cache for tier in engine.ladder])  # (the verifier's is None)
            estimate = cache_bytes(cfg, target.config, draft.config, length + 12, 4, remote=True)
            estimate -= row_bytes(cfg, target.config, draft.config)  # and no rebuild in flight:
            estimate -= rebuild_bytes(cfg, target.config, length + 12 + speculation_slack(cfg), 4, remote=True)
            full = target.config.kv_bytes_per_token(4) * length
            assert held > full // 2 and held <= estimate <= 1.6 * held, (length, held, estimate)
        llm = LLM(folder, workers=group.channel, dtype="float32", mode="retrieval", **for_mode("retrieval", SETTINGS))
        one = llm.cache_bytes_for(150, 12)  # (no draft for this folder)
        assert one == cache_bytes(llm.config, target.config, None, 162, 4, remote=True) < \
            cache_bytes(llm.config, target.config, None, 162, 4)
        assert llm.free_memory() is not None  # this process's device (it was None with a group)
        llm.free_memory = lambda: int(1.5 * one / llm.memory_share)
        assert llm._parts_that_fit([(150, 12)] * 2) == [[0], [1]]
    finally:
        group.close()


def test_tree_speculation_over_the_worker_group_reproduces_one_process(models, tmp_path):
    """The retrieval tier's trees checked by the workers (retrieval mode, tree2), and the draft's trees
    checked by the coordinator's retrieval tier ahead of the workers (triforce mode, tree1)."""
    folder, target, draft = models
    prompt = torch.randint(3, 96, (150,), generator=torch.Generator().manual_seed(3)).tolist()
    group = Group(folder, 2, tmp_path)
    try:
        for params in (SamplingParams(max_tokens=30, temperature=0, ignore_eos=True),
                       SamplingParams(max_tokens=30, temperature=0.9, seed=8, ignore_eos=True)):
            for mode, trees in (("retrieval", dict(tree2=8)), ("triforce", dict(tree1=8))):
                expected, _ = run(target, draft, mode, prompt, params, **trees)
                verifier = RemoteVerifier(group.channel, target, capacity(prompt, params) + 8, [])
                got, _ = run(target, draft, mode, prompt, params, verifier, **trees)
                assert got == expected, (mode, params.temperature)
    finally:
        group.close()


def test_trees_verify_and_commit_over_the_worker_group(models, tmp_path):
    """verify carries tokens and parents and the workers run them with the ancestor mask; commit keeps the
    accepted path: logits equal one process's, before and after the commit; bad trees get error replies."""
    folder, target, _ = models
    prompt = torch.randint(3, 96, (120,), generator=torch.Generator().manual_seed(5)).tolist()
    tokens, parents, path = [7, 30, 41, 12, 55, 9], [-1, 0, 0, 1, 2, 4], [0, 2, 4, 5]
    group = Group(folder, 2, tmp_path)
    try:
        params = SamplingParams(max_tokens=20)
        verifiers = [LocalVerifier(target, capacity(prompt, params)), remote(group, target, prompt, params)]
        logits = []
        for verifier in verifiers:
            verifier.prefill(prompt)
            start = verifier.length
            tree = verifier.forward(Step.tree(tokens, parents, start))
            verifier.keep_path(start, path)
            logits.append((tree, verifier.forward(Step.chain([3, 8], verifier.length))))
        assert verifiers[1].length == len(prompt) + len(path) + 2
        for got, want in zip(logits[1], logits[0]):
            torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4)
        with pytest.raises(WorkerError, match="parents"):
            verifiers[1].forward(Step(torch.tensor([1, 2]), torch.tensor([0, 1]) + verifiers[1].length,
                                      verifiers[1].length, (-1, 5), ancestor_mask([-1, 0])))
        with pytest.raises(WorkerError, match="kept path"):
            verifiers[1].keep_path(verifiers[1].length - 2, [1, 0])  # the last forward's two tokens, reversed
        assert verifiers[1].length == len(prompt) + len(path) + 2  # refused before anything ran
    finally:
        group.close()


def test_a_dead_worker_fails_the_request_within_the_timeout(models, tmp_path):
    folder, target, draft = models
    prompt = list(range(3, 90))
    group = Group(folder, 2, tmp_path, timeout_s=3.0)
    try:
        params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
        verifier = remote(group, target, prompt, params)
        group.procs[1].kill()  # not the leader: the leader blocks in a collective and stops answering
        start = time.monotonic()
        with pytest.raises(WorkerError, match="did not answer"):
            run(target, draft, "triforce", prompt, params, verifier)
        assert time.monotonic() - start < 10
    finally:
        group.close()


def test_bad_messages_get_error_replies_and_the_worker_keeps_serving(models, tmp_path):
    folder, _, _ = models
    group = Group(folder, 1, tmp_path)
    sock = zmq.Context.instance().socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(group.endpoint)
    try:
        group.channel.request("start", {"seq": 99, "capacity": 32, "forwards": []})  # a sequence for the refresh below
        bad = {
            "garbage": [b"\xc1\xc1\xc1"],
            "truncated": [encode("prefill", {"seq": 1, "tokens": [1, 2, 3], "start": 0})[0][:-2]],
            "wrong version": [encode("stats")[0].replace(b"\xa1v" + bytes([PROTOCOL_VERSION]), b"\xa1v\x63", 1)],
            "wrong schema": encode("prefill", {"seq": 1, "tokens": "abc", "start": 0, "final": True}),
            "oversized": [encode("stats")[0], b"\x00" * (300 * 2**20)],
            "out of order": encode("verify", {"seqs": [1], "tokens": [[1]], "parents": [[-1]], "starts": [0]}),
            "never started": encode("commit", {"seq": 7, "path": [], "start": 0}),
            "a sequence twice": encode("verify", {"seqs": [1, 1], "tokens": [[1], [2]], "parents": [[-1], [-1]],
                                                  "starts": [0, 0]}),
            # the first two reached every rank, which failed executing them, and the group ended
            "a reply, not a request": reply({}),
            "a running sequence started again": encode("start", {"seq": 99, "capacity": 32, "forwards": []}),  # it was replaced
            "a budget below a chunk": encode("refresh", {"seq": 99, "budget": -4, "chunk_size": 4, "full_layers": 0,
                                                         "start": 0}),
            "a budget of one chunk": encode("refresh", {"seq": 99, "budget": 4, "chunk_size": 4, "full_layers": 0,
                                                        "start": 0}),
        }
        for name, frames in bad.items():
            sock.send_multipart(frames)
            if name == "oversized":  # ZeroMQ drops the peer for an over-limit message: reconnect
                time.sleep(0.5)
                sock.close(0)
                sock = zmq.Context.instance().socket(zmq.REQ)
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(group.endpoint)
                continue
            assert sock.poll(10_000), name
            _, body, _ = decode(sock.recv_multipart())
            assert body["ok"] is False and body["error"], name
        body, _ = group.channel.request("stats")  # still serving
        assert body["errors"] == len(bad) - 1
    finally:
        sock.close(0)
        group.close()


MESSAGE_LIMIT = 64 * 2**10  # lowered for the test, as 256 MiB is to a 7B model's refresh


def test_scored_prompts_over_the_group_split_their_logits_under_the_message_limit(models, tmp_path):
    """Prompt log-probabilities over the group: the target's prompt chunks come back as logits, in chunks
    and requests that each fit the message limit (two sequences' chunks do not fit one), and equal one
    process's, as do the generated tokens' log-probabilities."""
    folder, target, draft = models
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, 96, (n,), generator=gen).tolist() for n in (150, 120)]
    params = [SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=2, prompt_logprobs=2),
              SamplingParams(max_tokens=0, prompt_logprobs=1)]
    cfg = EngineConfig(mode="triforce", **SETTINGS)
    alone = [build_engine(cfg, target, draft, len(p) + sp.max_tokens) for p, sp in zip(prompts, params)]
    expected = [engine.generate(p, sp)[0] for engine, p, sp in zip(alone, prompts, params)]
    group = Group(folder, 2, tmp_path, max_bytes=MESSAGE_LIMIT)
    try:
        engines, outputs, sent = batch_over_the_group(group, target, draft, cfg, prompts, params)
        assert outputs == expected
        rows = [sum(len(t) for t in body["tokens"]) for kind, body in sent if kind == "verify"]
        chunk = MESSAGE_LIMIT // 2 // (4 * target.output_vocab_size)  # 85 rows of 96 logits
        assert max(rows) == chunk and rows[:2] == [chunk, chunk]  # the first chunks of both: a request each
        for engine, single in zip(engines, alone):
            assert_same_logprobs(engine.prompt_logprobs[1:], single.prompt_logprobs[1:])
            assert_same_logprobs(engine.logprobs, single.logprobs)
        assert len(engines[0].prompt_logprobs) == 150 and len(engines[1].prompt_logprobs) == 120
        # the tiers built on the scored prefill (the retrieval cache from the group's KV) checked as alone
        checks = [[(t.proposed, t.accepted) for t in engine.stats] for engine in (engines[0], alone[0])]
        assert checks[0] == checks[1] and checks[0][0][0] > 0
    finally:
        group.close()


def test_forty_layers_with_kv_beyond_the_message_limit_match_one_process(tiny_dir, models, tmp_path):
    """A 7B model's layer count (a refresh reply once carried 1 + 2 x layers frames, over the 64-frame
    cap) and a refresh whose KV is several times the message limit: it comes over the bulk link."""
    folder = tiny_dir("deep-target", seed=72, hidden_size=16, num_heads=2, num_kv_heads=2, num_layers=40,
                      scale=25)
    target, draft = load_model(folder), models[2]
    prompt = torch.randint(3, 96, (160,), generator=torch.Generator().manual_seed(2)).tolist()
    params = SamplingParams(max_tokens=24, temperature=0.9, seed=5, ignore_eos=True)
    group = Group(folder, 2, tmp_path, max_bytes=MESSAGE_LIMIT)
    try:
        verifier, local = remote(group, target, prompt, params), LocalVerifier(target, capacity(prompt, params))
        verifier.prefill(prompt)
        local.prefill(prompt)
        got = verifier.kv_source().retrieve(32, 4, 1)
        assert sum(k.nbytes + v.nbytes for k, v in got) > 2 * MESSAGE_LIMIT
        assert_same_kv(got, local.kv_source().retrieve(32, 4, 1))
        expected, _ = run(target, draft, "triforce", prompt, params)
        got, metrics = run(target, draft, "triforce", prompt, params, remote(group, target, prompt, params))
        assert got == expected and metrics.retrieval_rebuilds > 1
    finally:
        group.close()


def test_replicated_kv_heads_choose_chunks_with_every_query_head(tiny_dir, models, tmp_path):
    """TP 3 over one KV head: each rank holds 2 of its 6 query heads; the chunks are scored with all 6,
    as in one process, not with the leader's 2. A one-token prompt is served (its first refresh, over an
    empty cache, ended every rank)."""
    folder = tiny_dir("one-kv-head-target", seed=73, hidden_size=48, num_heads=6, num_kv_heads=1, num_layers=3,
                      scale=25)
    target, draft = load_model(folder), models[2]
    prompt = torch.randint(3, 96, (200,), generator=torch.Generator().manual_seed(3)).tolist()
    params = SamplingParams(max_tokens=32, temperature=0.9, seed=6, ignore_eos=True)
    selecting = dict(budget=16, full_layers=0)  # 16 of 200 tokens in every layer: chunks are really chosen
    local = LocalVerifier(target, capacity(prompt, params))
    local.prefill(prompt)
    expected = retrieve_from_full(local.cache, 16, 4, 0)
    assert all(keys.shape[1] < len(prompt) // 4 for keys, _ in expected)
    leaders_heads_only = retrieve_from_full(local.cache, 16, 4, 0, torch.stack(local.cache.last_query)[:, :2])
    assert any(not torch.equal(a, b) for (a, _), (b, _) in zip(expected, leaders_heads_only))  # so this can fail
    group = Group(folder, 3, tmp_path)
    try:
        verifier = remote(group, target, prompt, params)
        verifier.prefill(prompt)
        assert_same_kv(verifier.kv_source().retrieve(16, 4, 0), expected)
        want, _ = run(target, draft, "triforce", prompt, params, **selecting)
        got, metrics = run(target, draft, "triforce", prompt, params, remote(group, target, prompt, params),
                           **selecting)
        assert got == want and metrics.retrieval_rebuilds > 1
        # A one-token prompt prefills nothing on the target, and the retrieval tier's first refresh finds an
        # empty cache: the group gathered every rank's last query (none yet) and every rank died
        greedy = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
        for short in ([7], [7, 9]):
            want, _ = run(target, draft, "triforce", short, greedy)
            assert run(target, draft, "triforce", short, greedy, remote(group, target, short, greedy))[0] == want
    finally:
        group.close()


def test_an_idle_group_outlives_its_collective_timeout(models, tmp_path):
    """The ranks other than the leader wait for the next request inside a collective; the leader's
    heartbeats (every timeout / 4) keep an idle group alive past the group's timeout. And while its
    coordinator stays connected, past the time after which a coordinator-less group gives up (the
    worker timeout, 2 s here)."""
    group = Group(models[0], 2, tmp_path, timeout_s=2.0, group_timeout_s=2.0)
    try:
        time.sleep(5)
        stats, _ = group.channel.request("stats")
        assert stats["heartbeats"] >= 5
        assert all(p.is_alive() for p in group.procs)
    finally:
        group.close()


def test_refused_requests_do_not_hold_back_the_heartbeat(models, tmp_path):
    """A refused request is answered by the leader alone while the other ranks wait in a collective; each
    one restarted the wait for the next heartbeat, so refusals under the heartbeat's period apart (a client
    retrying) let the group's collective time out, and the group ended."""
    group = Group(models[0], 2, tmp_path, timeout_s=2.0, group_timeout_s=2.0)
    try:
        end = time.monotonic() + 5
        while time.monotonic() < end:
            with pytest.raises(WorkerError, match="not started"):
                group.channel.request("commit", {"seq": 77, "path": [], "start": 0})
            time.sleep(0.1)
        stats, _ = group.channel.request("stats")
        assert stats["heartbeats"] >= 5 and stats["errors"] >= 20
        assert all(p.is_alive() for p in group.procs)
    finally:
        group.close()


def test_a_request_that_fails_to_build_ends_its_sequence_on_the_group(models, tmp_path, monkeypatch):
    """The group's sequence starts before the coordinator builds the request's own caches: where that
    failed (out of memory, say), nothing ended the sequence, whose cache the group then held for good."""
    import triforce.request

    folder = models[0]
    group = Group(folder, 1, tmp_path)
    try:
        llm = LLM(folder, workers=group.channel, mode="triforce", dtype="float32", budget=32, chunk_size=4)

        def out_of_memory(*args, **kwargs):
            raise MemoryError("the draft's caches")

        monkeypatch.setattr(triforce.request, "build_engine", out_of_memory)
        with pytest.raises(MemoryError):
            llm.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=4))
        stats, _ = group.channel.request("stats")
        assert stats["sequences"] == 0
    finally:
        group.close()


FROZEN_PEER = """
import sys, time, zmq
sock = zmq.Context.instance().socket(zmq.REQ)
sock.connect(sys.argv[1])
print("connected", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("how", ["closed", "frozen"])
def test_a_group_whose_coordinator_is_gone_exits(models, tmp_path, how):
    """The coordinator vanishes without a shutdown: its connection closed (killed on a live node), or a
    peer that stops answering without closing anything (a crashed node: a stopped process). The group
    must not heartbeat forever: every rank exits, non-zero, within a bound of the worker timeout."""
    timeout_s = 2.0
    group = Group(models[0], 2, tmp_path, timeout_s=timeout_s, group_timeout_s=2.0)
    frozen = None
    try:
        if how == "frozen":  # still connected, but its ZeroMQ I/O thread no longer answers pings
            frozen = subprocess.Popen([sys.executable, "-c", FROZEN_PEER, group.endpoint], stdout=subprocess.PIPE)
            assert frozen.stdout.readline() == b"connected\n"
            time.sleep(0.5)
            frozen.send_signal(signal.SIGSTOP)
        start = time.monotonic()
        group.channel.close()
        group.channel = None
        for p in group.procs:
            p.join(4 * timeout_s + 5)
        assert [p.exitcode for p in group.procs] == [1, 1], "the group outlived its coordinator"
        # closed: the worker timeout; frozen: half of it more for the pings to go unanswered
        assert time.monotonic() - start >= timeout_s
    finally:
        if frozen is not None:
            frozen.kill()
            frozen.wait()
        group.close()


@pytest.mark.slow
def test_smollm2_on_three_workers_reproduces_the_single_process_engine(smollm2_dir, tmp_path):
    """SmolLM2's 9 heads and 3 KV heads split over a tensor-parallel group of 3."""
    target = load_model(smollm2_dir, "float32")
    from triforce.llm_models import DEFAULT_DRAFTS

    draft = load_model(DEFAULT_DRAFTS["smollm2"], "float32")
    from transformers import AutoTokenizer

    text = "It is a truth universally acknowledged, that a single man in possession of a good fortune, " * 12
    prompt = AutoTokenizer.from_pretrained(smollm2_dir)(text).input_ids
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    group = Group(smollm2_dir, 3, tmp_path)
    try:
        expected, _ = run(target, draft, "triforce", prompt, params)
        got, _ = run(target, draft, "triforce", prompt, params, remote(group, target, prompt, params))
        assert got == expected
    finally:
        group.close()
