"""The graph-shaped forward (models/cuda_graphs.py) against the model's own forward: the same logits, keys,
values and last queries, for decode steps, chains and trees; and which forwards its policy takes. On the
CPU it runs uncaptured; where CUDA is (benchmarks/gpu_check.sh) the same tests capture and replay graphs."""
import pytest
import torch

from triforce.cache.full import FullKVCache
from triforce.cache.streaming import StreamingKVCache
from triforce.models.cuda_graphs import MAX_TOKENS, ForwardGraphs, buffers_key
from triforce.models.loader import load_model
from triforce.step import Step

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


@pytest.fixture(scope="module", params=DEVICES)
def model(request, tiny_dir):
    folder = tiny_dir("graphs", hidden_size=128, num_heads=4, num_kv_heads=2, num_layers=3)
    model = load_model(folder, "float32", device=request.param)
    model.forward_graphs = None  # its own forward, for comparison: each test makes the graphs it runs
    return model


def graphs_for(model):
    return ForwardGraphs(model, capture=model.device.type == "cuda")


def full_cache(model, capacity=80):
    return FullKVCache(model.config, capacity, model.dtype, model.device)


def test_static_forwards_equal_the_models_own(model):
    g = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(3, 96, (n,), generator=g)  # noqa: E731
    prompt = ids(30)
    own, static = full_cache(model), full_cache(model)
    graphs = graphs_for(model)
    for cache in (own, static):
        model(prompt, cache, logits_for="none")
    trees = {6: ([-1, 0, 0, 1, 1, 2], [0, 1, 3]), 5: ([-1, -1, 0, 1, 3], [1, 3, 4])}  # parents, a kept path
    # sizes and whether a tree: the forward of 6 runs a tree, then a chain (its mask back to causal)
    for n, tree in ((1, False), (4, False), (6, True), (1, False), (5, True), (4, False), (6, False)):
        step = Step.tree(ids(n), trees[n][0], own.length) if tree else Step.chain(ids(n), own.length)
        expected = model(step, own)
        got = graphs([step], [static], ["all"])[0]
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
        assert static.length == own.length
        torch.testing.assert_close(static.keys[:, :, :own.length], own.keys[:, :, :own.length], atol=1e-5, rtol=0)
        torch.testing.assert_close(static.values[:, :, :own.length], own.values[:, :, :own.length], atol=1e-5, rtol=0)
        for a, b in zip(static.last_query, own.last_query):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
        if tree:  # keep a root-to-leaf path of the tree, as a verifier does
            for cache in (own, static):
                cache.keep_path(step.start, trees[n][1])
    assert len(graphs) == 4  # token counts 1, 4, 6 and 5: one static forward each, reused at every length


def test_its_logits_outlive_the_next_run_and_want_is_honoured(model):
    cache = full_cache(model)
    graphs = graphs_for(model)
    model(torch.arange(3, 20), cache, logits_for="none")
    first = graphs([Step.chain([5, 6], cache.length)], [cache], ["all"])[0]
    kept = first.clone()
    last = graphs([Step.chain([7, 8], cache.length)], [cache], ["last"])[0]
    assert torch.equal(first, kept) and last.shape == (1, model.config.vocab_size)
    assert graphs([Step.chain([9, 10], cache.length)], [cache], ["none"]) == [None]
    assert cache.length == 17 + 6


def test_it_takes_one_sequence_over_a_full_cache_and_leaves_the_rest(model):
    graphs = graphs_for(model)
    cache, other = full_cache(model), full_cache(model)
    streaming = StreamingKVCache(model.config, 2, 8, 16, model.rope, model.dtype, model.device)
    one = Step.chain([3], 0)
    assert graphs.takes([one], [cache])
    assert not graphs.takes([one, one], [cache, other])  # batches run the model's own forward
    assert not graphs.takes([one], [streaming])
    assert not graphs.takes([Step.chain(list(range(3, 3 + MAX_TOKENS + 1)), 0)], [cache])  # a prefill chunk
    wide = Step(torch.tensor([3, 4]), torch.tensor([5, 6]), 4, None, torch.ones(2, 3, dtype=torch.bool))
    assert not graphs.takes([wide], [cache])  # a mask over earlier speculative entries


def test_models_on_cuda_get_graphs_unless_switched_off(model, monkeypatch):
    on_cuda = model.device.type == "cuda"
    assert (ForwardGraphs.for_model(model) is not None) == on_cuda
    monkeypatch.setenv("TRIFORCE_CUDA_GRAPHS", "0")
    assert ForwardGraphs.for_model(model) is None


def test_a_full_cache_refuses_a_step_past_its_capacity_before_anything_is_written(model):
    from triforce.cache.base import CacheCapacityError

    cache = full_cache(model, capacity=20)
    graphs = graphs_for(model)
    model(torch.arange(3, 20), cache, logits_for="none")
    before = cache.keys.clone()
    with pytest.raises(CacheCapacityError):
        graphs([Step.chain([3, 4, 5, 6], cache.length)], [cache], ["all"])
    assert torch.equal(cache.keys, before) and cache.length == 17


def test_each_caches_buffers_get_their_own_forwards_and_the_oldest_go_first(model, monkeypatch):
    monkeypatch.setattr("triforce.models.cuda_graphs.MAX_GRAPHS", 3)
    graphs = graphs_for(model)
    first, second = full_cache(model), full_cache(model)
    for cache in (first, second):
        model(torch.arange(3, 10), cache, logits_for="none")
    one = graphs([Step.chain([3], 7)], [first], ["last"])[0]
    assert torch.equal(graphs([Step.chain([3], 7)], [second], ["last"])[0], one)  # the same prompt and token
    assert len(graphs) == 2
    graphs([Step.chain([4, 5], 8)], [first], ["last"])
    graphs([Step.chain([4, 5], 8)], [second], ["last"])
    assert len(graphs) == 3  # the first cache's one-token forward, the least recently used, went
    assert buffers_key(first, 1) not in graphs._forwards and buffers_key(second, 1) in graphs._forwards


def test_the_model_replays_through_its_graphs_and_generates_as_without(model):
    """Greedy decoding, every step through the static forward, equals the model's own decoding."""
    def greedy(graphs):
        model.forward_graphs = graphs
        try:
            cache = full_cache(model)
            logits = model(torch.arange(3, 30), cache, logits_for="last")
            out = []
            for _ in range(12):
                out.append(int(logits[-1].argmax()))
                logits = model(torch.tensor(out[-1:]), cache, logits_for="last")
            return out, None if graphs is None else len(graphs)
        finally:
            model.forward_graphs = None

    replayed, forwards = greedy(graphs_for(model))
    assert replayed == greedy(None)[0]
    assert forwards == 2  # the prompt's 27 tokens (within MAX_TOKENS) and the decode steps' one


def test_a_size_runs_uncaptured_first_and_is_captured_at_its_second_forward(model):
    """Every forward it takes runs the same static math (a step's rounding never depends on what ran
    before); on CUDA the second forward of a size over the same buffers captures a graph, later ones replay."""
    graphs = graphs_for(model)
    own, cache = full_cache(model), full_cache(model)
    for c in (own, cache):
        model(torch.arange(3, 30), c, logits_for="none")
    for token in (5, 6, 7):
        expected = model(Step.chain([token], own.length), own, logits_for="last")
        got = graphs([Step.chain([token], cache.length)], [cache], ["last"])[0]
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
        forward = graphs._forwards[buffers_key(cache, 1)]
        assert (forward.graph is not None) == (model.device.type == "cuda" and forward.runs >= 2)
    assert forward.runs == 3 and len(graphs) == 1


def test_the_memory_check_counts_the_static_forwards_a_request_makes(tiny_dir):
    """The StaticForwards a triforce request's target makes (one per token count over its full cache: its
    checks, and a prompt chunk of up to MAX_TOKENS; run uncaptured here) hold what static_forward_bytes says
    each holds, none is larger than the sizes graph_bytes counts for it, and together they hold no more than
    it counts; before, the memory check counted none."""
    from held_bytes import held_bytes

    from triforce.config import EngineConfig
    from triforce.coordinator.hierarchy import build_engine, graph_bytes, graph_sizes, speculation_slack
    from triforce.models.cuda_graphs import static_forward_bytes
    from triforce.sampling_params import SamplingParams

    target = load_model(tiny_dir("graphs-target", seed=64, num_layers=2, vocab_size=512), "float32")
    draft = load_model(tiny_dir("graphs-draft", seed=65, num_layers=1, vocab_size=512), "float32")
    cfg = EngineConfig(mode="triforce", budget=32, chunk_size=8, full_layers=1, sinks=4, window=32)
    params = SamplingParams(max_tokens=40, temperature=0.8, seed=2, ignore_eos=True)
    for length in (200, 50):  # prefilled in one forward of 199 tokens (no graph), or of 49 (one)
        target.forward_graphs = graphs = ForwardGraphs(target, capture=False)
        prompt = torch.randint(3, 512, (length,), generator=torch.Generator().manual_seed(9)).tolist()
        build_engine(cfg, target, draft, length + 40).generate(prompt, params)
        forwards = list(graphs._forwards.values())
        sizes = sorted(forward.n for forward in forwards)
        assert len(sizes) >= 2 and (49 in sizes) == (length == 50), sizes  # checks of several sizes
        capacity = length + 40 + speculation_slack(cfg)
        assert {forward.key_index.shape[1] for forward in forwards} == {capacity}
        counted = sorted(graph_sizes(cfg), reverse=True)
        for n, largest in zip(sorted(sizes, reverse=True), counted):  # each within a size counted for it
            assert n <= largest, (sizes, counted)
        for forward in forwards:
            assert held_bytes([forward]) == static_forward_bytes(target.config, capacity, forward.n, 4)
        assert held_bytes(forwards) <= graph_bytes(cfg, target.config, capacity, 4)
