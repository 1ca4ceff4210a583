"""VerifierWorker's checks, which the leader runs before a request reaches every rank (workers/worker.py)."""
from types import SimpleNamespace

import pytest

from triforce.models.loader import load_model
from triforce.workers import worker as worker_module
from triforce.workers.worker import RequestError, VerifierWorker, prefix_bound


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_sequence_on_a_cpu_group_counts_every_ranks_share_of_the_hosts_memory(tiny_dir, monkeypatch, ranks):
    """On a CPU the ranks of `--workers W` share the host's memory and each allocates its share of a new
    sequence's cache at once: a cache whose one share fits but whose shares together do not is refused (the
    leader checked its own share alone, and a rank's allocation failed, ending the group)."""
    model = load_model(tiny_dir("worker-target", seed=5), "float32")
    leader = VerifierWorker(model, SimpleNamespace(rank=0, size=ranks), "id", kv_heads=model.config.num_kv_heads)
    share = model.kv_bytes_per_token * 100
    monkeypatch.setattr(worker_module, "available_bytes", lambda device: int(1.5 * share / 0.9))
    if ranks == 1:
        leader.check("start", {"seq": 1, "capacity": 100})
    else:
        with pytest.raises(RequestError, match="for the 2 ranks"):
            leader.check("start", {"seq": 1, "capacity": 100})


def test_a_ranks_prefix_store_takes_at_most_half_the_memory_free(monkeypatch):
    """As the in-process store: a group's default of 1 GiB per rank on a host with less free left the
    leader no room for any sequence (it counts the stores' room as taken), and every request was refused.
    On a CPU the group's ranks share the host's half."""
    monkeypatch.setattr(worker_module, "available_bytes", lambda device: 2**30)
    alone = SimpleNamespace(rank=0, size=1)
    assert prefix_bound(2**20, "cpu", alone) == 2**20  # fits: as asked
    assert prefix_bound(2**30, "cpu", alone) == 2**29
    assert prefix_bound(0, "cpu", alone) == 0
    monkeypatch.setattr(worker_module, "available_bytes", lambda device: None)  # unknown: as asked
    assert prefix_bound(2**30, "cpu", alone) == 2**30
