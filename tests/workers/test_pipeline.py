"""The distributed pipeline on CPU: a coordinator (this process) and a gloo worker group (spawned
processes) over loopback ZeroMQ. Greedy tokens and seeded samples equal the single-process engine's;
a dead worker fails the request within the timeout; bad messages get error replies."""
import multiprocessing
import socket
import time

import pytest
import torch
import torch.distributed as dist
import zmq

from triforce.config import EngineConfig, SamplingParams
from triforce.coordinator.hierarchy import build_engine, speculation_slack
from triforce.coordinator.remote import ControlChannel, RemoteVerifier, WorkerError, model_identity
from triforce.models.loader import load_model
from triforce.models.parallel import TensorParallel
from triforce.workers.protocol import decode, encode

SETTINGS = dict(budget=32, chunk_size=4, sinks=2, window=16, refresh_every=12, full_layers=1)


def _worker(rank: int, size: int, init: str, folder: str, endpoint: str) -> None:
    from triforce.workers.group import run_worker

    torch.set_num_threads(1)
    if size > 1:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=size)
    run_worker(folder, "float32", "cpu", TensorParallel(rank, size, dist.group.WORLD if size > 1 else None),
               endpoint)


def free_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


class Group:
    """`size` worker processes serving `folder`; shut down (or killed) on exit."""

    def __init__(self, folder, size, tmp_path, timeout_s=60.0):
        self.endpoint = free_endpoint()
        ctx = multiprocessing.get_context("spawn")
        init = f"file://{tmp_path}/rendezvous-{time.monotonic_ns()}"
        self.procs = [ctx.Process(target=_worker, args=(r, size, init, str(folder), self.endpoint), daemon=True)
                      for r in range(size)]
        for p in self.procs:
            p.start()
        self.channel = ControlChannel(self.endpoint, timeout_s)
        self.channel.handshake(model_identity(folder), size)

    def close(self):
        if not self.channel.broken:
            self.channel.request("shutdown")
        self.channel.close()
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()


@pytest.fixture(scope="module")
def models(tiny_dir):
    spec = dict(hidden_size=48, num_heads=12, num_kv_heads=6, seed=70, num_layers=3, scale=25)
    target_dir = tiny_dir("pipe-target", **spec)
    return target_dir, load_model(target_dir), load_model(tiny_dir("pipe-draft", seed=71, num_layers=1, scale=25))


def run(target, draft, mode, prompt, params, verifier=None):
    cfg = EngineConfig(mode=mode, **SETTINGS)
    return build_engine(cfg, target, draft, len(prompt) + params.max_tokens, verifier).generate(prompt, params)


def remote(group, target, prompt, params):
    capacity = len(prompt) + params.max_tokens + speculation_slack(EngineConfig(**SETTINGS))
    return RemoteVerifier(group.channel, target, capacity, prefill_chunk=64)


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
        bad = {
            "garbage": [b"\xc1\xc1\xc1"],
            "truncated": [encode("prefill", {"tokens": [1, 2, 3], "start": 0})[0][:-2]],
            "wrong version": [encode("stats")[0].replace(b"\x01", b"\x63", 1)],
            "wrong schema": encode("prefill", {"tokens": "abc", "start": 0}),
            "oversized": [encode("stats")[0], b"\x00" * (300 * 2**20)],
            "out of order": encode("verify", {"tokens": [1], "parents": [-1], "start": 0}),
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


@pytest.mark.slow
def test_smollm2_on_three_workers_reproduces_the_single_process_engine(smollm2_dir, tmp_path):
    """SmolLM2's 9 heads and 3 KV heads split over a tensor-parallel group of 3."""
    target = load_model(smollm2_dir, "float32")
    from triforce.api import DEFAULT_DRAFTS

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
