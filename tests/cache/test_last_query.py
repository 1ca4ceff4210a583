"""The query a static retrieval cache (re)builds from (TriForce: the latest token's): after a check, the
last kept token's, as a cache that ran only the kept tokens holds it, on the layer-by-layer path and on
the fused CPU loop (whose prompt here is too long for it: it takes the buffers, then leaves the forward to
the layers); not the check's last row, a proposal the check rejected."""
import pytest
import torch

from triforce.cache.full import FullKVCache
from triforce.kernels.cpu import cpu_kernels
from triforce.models.loader import load_model
from triforce.step import Step

from checkpoints import write_tiny_checkpoint

# (parents of the check's tokens, None for a chain; the kept path: a chain's prefix or a tree's root-to-leaf)
PROMPT = 80  # 2 query heads per KV head x 80 rows: more than the CPU attention kernel takes (128)
CHECKS = [(None, [0]), (None, [0, 1, 2]), (None, list(range(7))),
          ([-1, 0, 0, 1, 2, 2, 3], [0, 2, 5]), ([-1, 0, 1, 0], [0, 3])]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("q") / "m", vocab_size=96, hidden_size=256, num_heads=4,
                                 num_kv_heads=2, scale=10.0)


def queries(cache):
    return torch.stack(cache.last_query).float()


@pytest.mark.parametrize("dtype,fused", [("float32", False), ("bfloat16", False), ("bfloat16", True)])
@pytest.mark.parametrize("parents,path", CHECKS)
def test_last_query_is_the_last_kept_tokens_own(folder, dtype, fused, parents, path):
    model = load_model(folder, dtype)
    if fused and cpu_kernels() is None:
        pytest.skip("no CPU bfloat16 kernels here")
    if not fused:
        model.fused_layers = None
    g = torch.Generator().manual_seed(len(path))
    prompt, check = torch.randint(3, 96, (PROMPT,), generator=g), torch.randint(3, 96, (7 if parents is None else
                                                                                     len(parents),), generator=g)
    checked = FullKVCache(model.config, 128, model.dtype, "cpu")
    model(prompt, checked, logits_for="none")
    step = Step.chain(check, PROMPT) if parents is None else Step.tree(check, parents, PROMPT)
    model(step, checked, logits_for="none")
    assert (checked._layer_queries is None) == fused  # the fused loop ran the check, and kept its queries
    last_row = queries(checked)  # no row dropped yet: the check's last
    checked.keep_path(PROMPT, path)
    alone = FullKVCache(model.config, 128, model.dtype, "cpu")
    model(torch.cat((prompt, check[path])), alone, logits_for="none")
    tolerance = dict(atol=1e-4, rtol=1e-4) if dtype == "float32" else dict(atol=0.1, rtol=0.05)
    torch.testing.assert_close(queries(checked), queries(alone), **tolerance)
    if path[-1] != len(check) - 1:  # the check's last row is another token's query, and far from this one
        assert not torch.allclose(queries(checked), last_row, **tolerance)


def test_a_check_as_long_as_the_fused_loop_takes_keeps_the_accepted_query(tmp_path):
    """With a KV head per query head the fused loop takes checks of up to 128 tokens: the queries the cache
    keeps cover all of them (a window shorter than the check returned the check's last row, silently)."""
    if cpu_kernels() is None:
        pytest.skip("no CPU bfloat16 kernels here")
    folder = write_tiny_checkpoint(tmp_path / "mha", vocab_size=96, hidden_size=256, num_heads=4, num_kv_heads=4,
                                   scale=10.0)
    model = load_model(folder, "bfloat16")
    g = torch.Generator().manual_seed(1)
    rows = min(120, model.fused_layers.max_rows)  # as many as the fused loop takes here (96 at avx2)
    prompt, check = torch.randint(3, 96, (20,), generator=g), torch.randint(3, 96, (rows,), generator=g)
    checked = FullKVCache(model.config, 160, model.dtype, "cpu")
    model(prompt, checked, logits_for="none")
    model(Step.chain(check, 20), checked, logits_for="none")
    assert checked._layer_queries is None  # the fused loop ran the check (a 120-row one went layer by layer)
    checked.keep_path(20, list(range(5)))
    alone = FullKVCache(model.config, 160, model.dtype, "cpu")
    model(torch.cat((prompt, check[:5])), alone, logits_for="none")
    torch.testing.assert_close(queries(checked), queries(alone), atol=0.1, rtol=0.05)


@pytest.mark.parametrize("fused", [False, True])
def test_a_cost_measurement_leaves_the_last_tokens_query(folder, fused):
    """Mode auto measures a tier's forward costs with filler tokens it rolls back: the full cache's query
    was then a filler row's, and a retrieval cache built right after (the first plans at a context) chose
    its chunks against it instead of the prompt's last token's."""
    from triforce.coordinator.costs import forward_seconds
    from triforce.coordinator.verifier import LocalVerifier

    model = load_model(folder, "bfloat16")
    if fused and cpu_kernels() is None:
        pytest.skip("no CPU bfloat16 kernels here")
    if not fused:
        model.fused_layers = None
    prompt = torch.randint(3, 96, (PROMPT,), generator=torch.Generator().manual_seed(9)).tolist()
    target = LocalVerifier(model, 128)
    for step in target.prefill_steps(prompt):
        model(step, target.cache, logits_for="none")
    before = queries(target.cache)
    forward_seconds([target], (6,))
    assert target.length == PROMPT and torch.equal(queries(target.cache), before)


def test_a_saved_query_state_outlives_the_buffers_a_forward_handed_over(folder):
    """A CUDA graph's forward (models/cuda_graphs.py) hands the cache views of its own query buffers
    (`written`), which its next run overwrites: the state a cost measurement saves before its filler
    forwards is a copy, or the filler's queries came back as the last token's."""
    config = load_model(folder, "float32").config
    cache = FullKVCache(config, 16, torch.float32, "cpu")
    buffers = [torch.randn(config.num_heads, 3, config.head_dim) for _ in range(config.num_layers)]

    def graphed(tokens):  # what StaticForward does to the cache
        cache.begin(Step.chain(tokens, cache.length))
        cache.written(buffers)
        cache.end()

    graphed([5, 6, 7])
    before, state = queries(cache).clone(), cache.query_state()
    for buffer in buffers:
        buffer.normal_()  # the filler's run writes its queries where the last forward's were
    graphed([0, 0, 0])
    cache.rollback(3)
    cache.restore_query_state(state)
    assert torch.equal(queries(cache), before)
