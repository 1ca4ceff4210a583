"""VerifierWorker's checks, which the leader runs before a request reaches every rank (workers/checks.py)."""
from types import SimpleNamespace

import pytest
import torch

from triforce.models.loader import load_model
from triforce.models.parallel import TensorParallel
from triforce.workers import checks as checks_module
from triforce.workers import worker as worker_module
from triforce.workers.checks import NeverFits, NoRoom, RequestError
from triforce.workers.worker import VerifierWorker, prefix_bound


@pytest.mark.parametrize("ranks,local", [(1, None), (2, None), (2, "3"), (2, "1")])
def test_a_sequence_on_a_cpu_group_counts_every_ranks_share_of_the_hosts_memory(tiny_dir, monkeypatch, ranks,
                                                                                  local):
    """On a CPU the ranks on the leader's host share its memory (all W of `--workers W`: torchrun counts
    them and the coordinator in LOCAL_WORLD_SIZE) and each allocates its share of a new sequence's cache at
    once: a cache whose one share fits but whose shares together do not is refused (the leader checked its
    own share alone, and a rank's allocation failed, ending the group). Ranks on other hosts (one a host
    here) take theirs elsewhere."""
    if local is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local)
    model = load_model(tiny_dir("worker-target", seed=5), "float32")
    leader = VerifierWorker(model, SimpleNamespace(rank=0, size=ranks), "id", kv_heads=model.config.num_kv_heads)
    share = model.kv_bytes_per_token * 100
    monkeypatch.setattr(checks_module, "available_bytes", lambda device: int(1.5 * share / 0.9))
    if ranks == 1 or local == "1":
        leader.check("start", {"seq": 1, "capacity": 100, "forwards": []})
    else:
        with pytest.raises(NeverFits, match="for the 2 ranks"):  # for good: it holds no other sequence
            leader.check("start", {"seq": 1, "capacity": 100, "forwards": []})


def test_the_groups_caches_take_the_share_given_and_a_refusal_trims_the_heap_first(tiny_dir, monkeypatch):
    """--gpu-memory-utilization reached the coordinator alone: the group's caches took 0.9 of the free
    memory whatever it said. On a CPU glibc keeps ended sequences' caches, which the free memory then lacks:
    a sequence that would be refused trims the heap and looks again (and every rank trims after an end)."""
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    model = load_model(tiny_dir("worker-target", seed=5), "float32")
    need = model.kv_bytes_per_token * 100
    free = [int(need / 0.7)]  # fits 0.9 of it, not 0.5
    monkeypatch.setattr(checks_module, "available_bytes", lambda device: free[0])
    alone = SimpleNamespace(rank=0, size=1)
    VerifierWorker(model, alone, "id", kv_heads=model.config.num_kv_heads).check(
        "start", {"seq": 1, "capacity": 100, "forwards": []})
    half = VerifierWorker(model, alone, "id", kv_heads=model.config.num_kv_heads, memory_share=0.5)
    with pytest.raises(NeverFits):
        half.check("start", {"seq": 1, "capacity": 100, "forwards": []})
    trims = []

    def trim(every_s=None):  # what glibc held of ended caches comes back
        trims.append(every_s)
        free[0] = int(need / 0.4)

    monkeypatch.setattr(checks_module, "release_freed", trim)
    half.check("start", {"seq": 1, "capacity": 100, "forwards": []})
    assert trims == [0]
    ended = []  # each end, however many end within a second (a batch ending together)
    monkeypatch.setattr(worker_module, "release_freed", lambda every_s=None: ended.append(every_s))
    for seq in (1, 2):
        half.execute("start", {"seq": seq, "capacity": 100, "forwards": []})
    for seq in (1, 2):
        half.execute("end", {"seq": seq})
    assert ended == [0, 0] and not half.caches


def test_a_ranks_prefix_store_takes_at_most_half_the_memory_free(monkeypatch):
    """As the in-process store: a group's default of 1 GiB per rank on a host with less free left the
    leader no room for any sequence (it counts the stores' room as taken), and every request was refused.
    On a CPU the group's ranks on one host share its half, and every rank takes the least any rank found,
    so that their stores keep the same blocks."""
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(worker_module, "available_bytes", lambda device: 2**30)
    alone = SimpleNamespace(rank=0, size=1)
    assert prefix_bound(2**20, "cpu", alone) == 2**20  # fits: as asked
    assert prefix_bound(2**30, "cpu", alone) == 2**29
    assert prefix_bound(0, "cpu", alone) == 0
    reduced = []

    def least_of_the_group(tensor, op, group):  # another rank found 2**26 free
        reduced.append(op)
        tensor.fill_(min(int(tensor.item()), 2**26))

    monkeypatch.setattr(worker_module.dist, "all_reduce", least_of_the_group)
    pair = SimpleNamespace(rank=0, size=2, group=None)
    assert prefix_bound(2**27, "cpu", pair) == 2**26 and reduced == [worker_module.dist.ReduceOp.MIN]
    monkeypatch.setattr(worker_module.dist, "all_reduce", lambda tensor, op, group: None)  # alike
    assert prefix_bound(2**30, "cpu", pair) == 2**28  # two ranks on this host: half of half each
    monkeypatch.setattr(worker_module, "available_bytes", lambda device: None)  # unknown: as asked
    assert prefix_bound(2**30, "cpu", alone) == 2**30
    # a rank that cannot tell its free memory still joins the reduction (alone it left the others waiting)
    monkeypatch.setattr(worker_module.dist, "all_reduce", least_of_the_group)
    assert prefix_bound(2**27, "cpu", pair) == 2**26 and len(reduced) == 2


def test_only_the_leader_hands_back_a_verify_requests_logits(tiny_dir):
    """Every rank ran `.cpu()` on the whole [n, V] logits of a verify request (a GPU-to-host copy per rank
    per check) though only the leader's reply carries them; the others hand back none. (A 1-rank model: each
    rank's forward here is the whole model's, the group's collectives left out.)"""
    model = load_model(tiny_dir("worker-target", seed=5), "float32")
    out = []
    for rank in (0, 1):
        worker = VerifierWorker(model, SimpleNamespace(rank=rank, size=1), "id", kv_heads=model.config.num_kv_heads)
        worker.execute("start", {"seq": 1, "capacity": 32, "forwards": []})
        worker.execute("prefill", {"seq": 1, "tokens": [3, 4, 5], "final": True})
        out.append(worker.execute("verify", {"seqs": [1], "tokens": [[6, 7]], "parents": [[-1, 0]], "starts": [3]}))
    (lead, lead_tensors), (other, other_tensors) = out
    assert lead == other == {"lengths": [5]} and other_tensors == []
    assert lead_tensors[0].shape == (2, model.config.vocab_size)  # a row per checked token


def test_a_commit_keeps_a_path_of_the_last_verify_or_is_refused(tiny_dir):
    """A commit keeps, of the last verify's tree, a path from a root down (the tokens before its start, then
    its path): the leader refused only indices out of order or range, so a commit of nodes on no one path, of
    a path after the tree was already cut to one, or below what the verify started from (committed tokens)
    went through and left the cache holding KV of tokens that never followed each other."""
    model = load_model(tiny_dir("worker-target", seed=5), "float32")
    leader = VerifierWorker(model, SimpleNamespace(rank=0, size=1), "id", kv_heads=model.config.num_kv_heads)
    shaken = leader.execute("handshake", {})[0]
    assert shaken["dtype"] == "float32" and shaken["machine"].endswith(f"threads={torch.get_num_threads()}")  # (the
    # coordinator compares its dtype, and keys the group's forward costs by its devices)
    leader.execute("start", {"seq": 1, "capacity": 32, "forwards": []})
    leader.execute("prefill", {"seq": 1, "tokens": [3, 4, 5], "final": True})
    leader.execute("verify", {"seqs": [1], "tokens": [[6, 7, 8, 9]], "parents": [[-1, 0, 0, 2]], "starts": [3]})
    # 1 and 2 are children of 0, 3 of 2: (6, []) keeps 0, 1 and 2
    for start, path in ((3, [1]), (3, [0, 1, 2]), (3, [2, 3]), (4, [2]), (6, [])):
        with pytest.raises(RequestError, match="does not go from a root"):
            leader.check("commit", {"seq": 1, "start": start, "path": path})
    with pytest.raises(RequestError, match="committed before its last verify"):
        leader.check("commit", {"seq": 1, "start": 2, "path": []})
    for start, path in ((3, [0, 2, 3]), (4, [1, 2]), (3, [0, 1]), (5, [])):
        leader.check("commit", {"seq": 1, "start": start, "path": path})
    leader.execute("commit", {"seq": 1, "start": 3, "path": [0, 2, 3]})
    assert leader.caches[1].length == 6
    with pytest.raises(RequestError, match="last request was no verify"):
        leader.check("commit", {"seq": 1, "start": 3, "path": [0]})
    leader.check("commit", {"seq": 1, "start": 4, "path": []})  # a rollback to what the verify kept
    leader.execute("verify", {"seqs": [1], "tokens": [[6, 7]], "parents": [[-1, -1]], "starts": [6]})
    leader.execute("prefill", {"seq": 1, "tokens": [5, 5], "final": True})  # the tree is no longer last
    with pytest.raises(RequestError, match="last request was no verify"):
        leader.check("commit", {"seq": 1, "start": 6, "path": [0, 3]})


def test_a_refresh_whose_chunk_means_do_not_fit_is_refused_not_run(tiny_dir, monkeypatch):
    """The first refresh that selects chunks allocates the cache's chunk means on every rank: where they do
    not fit, the allocation failed inside the group's execution and ended the group (every request on it).
    Now the leader refuses that refresh; one that keeps the whole cache, or finds its means made, runs."""
    model = load_model(tiny_dir("worker-target", seed=5), "float32")
    leader = VerifierWorker(model, SimpleNamespace(rank=0, size=1), "id", kv_heads=model.config.num_kv_heads)
    for seq in (1, 2):
        leader.execute("start", {"seq": seq, "capacity": 400, "forwards": []})
    refresh = {"seq": 2, "budget": 32, "chunk_size": 4, "full_layers": 0, "start": 300}
    leader.caches[2].length = 300  # its KV restored from the prefix store, no forward run: no query to choose by
    with pytest.raises(RequestError, match="no forward has run on sequence 2"):  # (it ended the group)
        leader.check("refresh", refresh)
    leader.execute("prefill", {"seq": 1, "tokens": [3 + i % 50 for i in range(300)], "final": True})
    cache = leader.caches[1]
    means = cache.means_bytes(4)
    assert means == cache.keys.nbytes // 4  # one mean per 4 keys: an eighth of the KV (keys and values)
    monkeypatch.setattr(checks_module, "available_bytes", lambda device: int(0.5 * means))
    refresh = {"seq": 1, "budget": 32, "chunk_size": 4, "full_layers": 0, "start": 300}
    with pytest.raises(RequestError, match="chunk means of sequence 1 need"):
        leader.check("refresh", refresh)
    leader.check("refresh", {**refresh, "budget": 300})  # keeps everything: no means
    monkeypatch.setattr(checks_module, "available_bytes", lambda device: 4 * means)
    leader.check("refresh", refresh)
    cache.chunk_means(4)
    monkeypatch.setattr(checks_module, "available_bytes", lambda device: 0)
    assert cache.means_bytes(4) == 0
    leader.check("refresh", refresh)  # made already: nothing new to allocate


def test_a_worker_builds_the_cpu_kernels_before_it_serves(tiny_dir, monkeypatch):
    """On a fresh machine the kernels compile on first use; a worker that first used them in its first
    prefill missed the coordinator's 60 s for that request (seen with two ranks on 2 cores). Its model
    loads them (LlamaModel.finalize)."""
    import triforce.models.llama as llama_module
    from triforce.workers import group

    events = []
    monkeypatch.setattr(llama_module, "cpu_kernels", lambda: events.append("kernels"))
    monkeypatch.setattr(group, "serve", lambda *a: events.append("serve"))
    group.run_worker(tiny_dir("worker-target", seed=5), "float32", "cpu", TensorParallel(0, 1), None, None)
    assert events == ["kernels", "serve"]


def test_a_one_rank_group_that_replays_graphs_counts_their_buffers(tiny_dir, monkeypatch):
    """A one-rank group on a GPU replays a sequence's forwards as CUDA graphs, each with buffers of its own
    (float32 logits for every token): a start counts those of the forwards the coordinator names (their
    token counts, hierarchy.graph_sizes), where the KV alone would fit, and those a running sequence has
    not made yet (graphs uncaptured here, on a CPU)."""
    from triforce.config import EngineConfig
    from triforce.coordinator.hierarchy import graph_sizes
    from triforce.models.cuda_graphs import ForwardGraphs, forwards_bytes

    model = load_model(tiny_dir("worker-target", seed=5), "float32")
    leader = VerifierWorker(model, SimpleNamespace(rank=0, size=1), "id", kv_heads=model.config.num_kv_heads)
    forwards = graph_sizes(EngineConfig(), prefill_chunk=64)
    assert forwards[-1] == 64 and len(forwards) > 20
    kv = model.kv_bytes_per_token * 100
    graphs = forwards_bytes(model.config, 100, forwards, 4)
    assert graphs > kv  # (the float32 logits of 31 forwards of up to 64 tokens)
    monkeypatch.setattr(checks_module, "available_bytes", lambda device: int((kv + graphs / 2) / 0.9))
    start = {"seq": 1, "capacity": 100, "forwards": forwards}
    leader.check("start", start)  # no graphs here: the KV fits
    model.forward_graphs = ForwardGraphs(model, capture=False)
    with pytest.raises(NeverFits, match="and its graphed forwards needs"):
        leader.check("start", start)
    leader.check("start", {**start, "forwards": forwards[:3]})  # a few small forwards fit
    monkeypatch.setattr(checks_module, "available_bytes", lambda device: int((kv + graphs) / 0.9) + 1)
    leader.check("start", start)
    for bad in ([0], [65], [1] * 129):
        with pytest.raises(RequestError, match="forwards of 1 to 64 tokens"):
            leader.check("start", {**start, "forwards": bad})
    # Started, sequence 1 holds its KV (the free memory, written here, shows it gone) but none of its
    # forwards yet: another sequence finds no room until sequence 1 has made them
    leader.execute("start", start)
    with pytest.raises(NoRoom, match="and its graphed forwards"):
        leader.check("start", {**start, "seq": 2})
    leader.execute("prefill", {"seq": 1, "tokens": list(range(3, 67)), "final": False})  # one of 64 tokens
    made = leader.model.forward_graphs.held_bytes(leader.caches[1])
    assert made == forwards_bytes(model.config, 100, [64], 4) and len(leader.model.forward_graphs) == 1
    monkeypatch.setattr(checks_module, "available_bytes", lambda device: int((kv + graphs) / 0.9) + made + 1)
    with pytest.raises(NoRoom):
        leader.check("start", {**start, "seq": 2})  # the rest of sequence 1's forwards still to come
    monkeypatch.setattr(checks_module, "available_bytes", lambda device: int((kv + graphs) / 0.9) + graphs - made + 1)
    leader.check("start", {**start, "seq": 2})
    leader.execute("end", {"seq": 1})
    monkeypatch.setattr(checks_module, "available_bytes", lambda device: int((kv + graphs) / 0.9) + 1)
    leader.check("start", {**start, "seq": 2})


def test_forwards_made_over_a_caches_buffers_do_not_stand_for_the_sizes_it_has_yet_to_make(tiny_dir, monkeypatch):
    """What a running sequence's graphed forwards may still allocate is its declared sizes not made yet:
    the bytes of every forward made over its buffers (one of 64 tokens it never declared, or an earlier
    cache's there: the allocator hands the memory on) were subtracted, and hid the small ones to come."""
    from triforce.models.cuda_graphs import ForwardGraphs, forwards_bytes

    model = load_model(tiny_dir("worker-target", seed=5), "float32")
    model.forward_graphs = ForwardGraphs(model, capture=False)
    leader = VerifierWorker(model, SimpleNamespace(rank=0, size=1), "id", kv_heads=model.config.num_kv_heads)
    small = [1, 2, 3]
    leader.execute("start", {"seq": 1, "capacity": 100, "forwards": small})
    leader.execute("prefill", {"seq": 1, "tokens": list(range(3, 67)), "final": False})  # a forward of 64
    assert model.forward_graphs.made(leader.caches[1]) == {64}
    assert leader._graphs_to_come() == forwards_bytes(model.config, 100, small, 4)


def test_a_sharded_model_replays_no_graphs():
    """A rank's shard meets the other ranks' in collectives at every layer: it runs its own forwards, and a
    start counts no graphs for it."""
    from triforce.models.cuda_graphs import ForwardGraphs

    shard = SimpleNamespace(device=torch.device("cuda"), tp=SimpleNamespace(size=2))
    assert ForwardGraphs.for_model(shard) is None


class InProcessChannel:
    """A group of one rank in this process behind ControlChannel's interface: the leader checks each
    request, then executes it (what a group does, without its messages)."""

    def __init__(self, leader: VerifierWorker, prefill_chunk: int):
        self.leader, self.prefill_chunk, self.tp_size = leader, prefill_chunk, 1
        self.max_bytes, self.broken, self.seqs, self.machine = 2**28, False, 0, ""

    def new_sequence(self) -> int:
        self.seqs += 1
        return self.seqs

    def request(self, kind: str, body: dict | None = None):
        self.leader.check(kind, body or {})
        return self.leader.execute(kind, body or {})


@pytest.mark.parametrize("trees", [{}, {"tree1": 6}])
def test_the_forwards_a_start_names_cover_those_the_group_makes(tiny_dir, trees):
    """The token counts a request's start names (graph_sizes for the group's prefill chunk) cover the
    static forwards the group makes for it, each within a size counted for it: prompt chunks of the group's
    block (its last shorter), and checks of the draft's chains and trees."""
    from triforce.config import EngineConfig
    from triforce.coordinator.hierarchy import build_engine, graph_sizes, speculation_slack
    from triforce.coordinator.remote import RemoteVerifier
    from triforce.models.cuda_graphs import ForwardGraphs, forwards_bytes
    from triforce.sampling_params import SamplingParams

    target = load_model(tiny_dir("worker-graphs-target", seed=66, num_layers=2), "float32")
    draft = load_model(tiny_dir("worker-graphs-draft", seed=67, num_layers=1), "float32")
    target.forward_graphs = graphs = ForwardGraphs(target, capture=False)
    leader = VerifierWorker(target, SimpleNamespace(rank=0, size=1), "id", kv_heads=target.config.num_kv_heads)
    channel = InProcessChannel(leader, prefill_chunk=32)
    cfg = EngineConfig(mode="draft", sinks=4, window=64, **trees)
    prompt = torch.randint(3, 96, (80,), generator=torch.Generator().manual_seed(10)).tolist()
    params = SamplingParams(max_tokens=30, temperature=0.8, seed=4, ignore_eos=True)
    capacity = len(prompt) + params.max_tokens + speculation_slack(cfg)
    forwards = graph_sizes(cfg, channel.prefill_chunk)
    verifier = RemoteVerifier(channel, target, capacity, forwards)
    build_engine(cfg, target, draft, len(prompt) + params.max_tokens, verifier).generate(prompt, params)
    cache = leader.caches[verifier.seq]
    sizes = sorted((forward.n for forward in graphs._forwards.values()), reverse=True)
    assert sizes[:2] == [32, 15] and len(sizes) >= 3, sizes  # chunks of 32 (the last of 15), and checks
    for n, largest in zip(sizes, sorted(forwards, reverse=True)):
        assert n <= largest, (sizes, forwards)
    assert graphs.held_bytes(cache) == forwards_bytes(target.config, capacity, sizes, 4) \
        <= forwards_bytes(target.config, capacity, forwards, 4)
