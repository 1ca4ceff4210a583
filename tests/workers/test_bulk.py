"""The bulk link over gloo: tensors of any dtype arrive as sent, and a receive never hangs: it fails at
once when the peer died and within the group's timeout when the peer is alive but sends nothing."""
import os
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import processes
from triforce.workers.bulk import BulkLink, LinkError

TIMEOUT_S = 2.0


def tensors() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 5, 3, generator=g).to(torch.bfloat16), torch.empty(2, 0, 3),
            torch.arange(7, dtype=torch.int64), torch.randn(4, generator=g)]


def link(rank: int, init: str) -> BulkLink:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2, timeout=timedelta(seconds=60))
    return BulkLink(dist.new_group([0, 1], backend="gloo", timeout=timedelta(seconds=TIMEOUT_S)), peer=1 - rank)


def _peer(init: str, behaviour: str) -> None:
    peer = link(1, init)
    if behaviour == "send, then die":
        peer.send(tensors())
        os._exit(0)  # no goodbye: sockets closed by the kernel, as when a worker is killed
    time.sleep(3 * TIMEOUT_S)  # "silent": alive, sends nothing


@pytest.fixture
def peer_with(tmp_path):
    procs = []

    def start(behaviour: str) -> BulkLink:
        init = f"file://{tmp_path}/rendezvous-{time.monotonic_ns()}"
        procs.append(processes.context().Process(target=_peer, args=(init, behaviour), daemon=True))
        procs[-1].start()
        return link(0, init)

    yield start
    for p in procs:
        p.kill()
        p.join()
    dist.destroy_process_group()


def test_tensors_arrive_then_a_dead_peer_fails_the_receive_at_once(peer_with):
    link0 = peer_with("send, then die")
    sent = tensors()
    got = link0.receive([(t.dtype, list(t.shape)) for t in sent])
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, sent))
    start = time.monotonic()
    with pytest.raises(LinkError, match="failed"):
        link0.receive([(torch.float32, [4])])
    assert time.monotonic() - start < TIMEOUT_S


def test_a_silent_peer_fails_the_receive_within_the_timeout(peer_with):
    link0 = peer_with("silent")
    start = time.monotonic()
    with pytest.raises(LinkError, match="[Tt]imed out"):
        link0.receive([(torch.float32, [4])])
    assert TIMEOUT_S * 0.9 < time.monotonic() - start < TIMEOUT_S * 2
