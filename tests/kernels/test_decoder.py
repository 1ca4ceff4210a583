"""The fused layer loop (kernels/decoder.py) against the model's own layer-by-layer loop."""
import pytest
import torch

from triforce.cache.full import FullKVCache
from triforce.cache.retrieval import LocalKVSource, RetrievalKVCache
from triforce.cache.streaming import StreamingKVCache
from triforce.kernels import attention, linear
from triforce.kernels.cpu import cpu_kernels, native_bf16
from triforce.models.loader import load_model
from triforce.models.quantized import int8_twin
from triforce.step import Step

from checkpoints import write_tiny_checkpoint



def prefill_rows() -> int:
    """A prompt's rows: past what the linear kernel takes in one call (24; 96 at the avx2 level, 128 at amx),
    so its products take the kernel in pieces."""
    return linear.kernel_max_rows() + 5


def prefill_fused() -> bool:
    """Whether the fused loop takes the prefill: where its 2 query heads per KV head are within attention's
    rows (at the avx512 level; at avx2 and amx, where the linear kernel takes 96 and 128 rows, they are not)."""
    return 2 * prefill_rows() <= attention.kernel_max_rows()


def decode(model, fused):
    """A prefill, then forwards of 1 to 7 tokens on a static retrieval cache (speculation) and on the
    full cache it draws from (commits), chains and trees (whose accepted path the full cache keeps).
    Returns every forward's logits and the full cache's state."""
    saved = model.fused_layers
    model.fused_layers = fused
    try:
        g = torch.Generator().manual_seed(0)
        full = FullKVCache(model.config, prefill_rows() + 32, model.dtype, "cpu")
        retrieval = RetrievalKVCache(LocalKVSource(full), 16, 4, "static", full_layers=1, refresh_every=10,
                                     max_speculative=40)
        logits = [model(torch.randint(3, 96, (prefill_rows(),), generator=g), full)]
        retrieval.sync()
        for n in (1, 3, 7, 2, 1):
            tokens = torch.randint(3, 96, (n,), generator=g)
            logits.append(model(tokens, retrieval))
            logits.append(model(tokens, full))
            retrieval.sync()
        for parents, path in (([-1, 0, 0, 1, 2, 2, 3], [0, 2, 5]), ([-1, 0, 1, 0], [0, 3])):
            tokens, start = torch.randint(3, 96, (len(parents),), generator=g), full.length
            logits.append(model(Step.tree(tokens, parents, start), retrieval))
            logits.append(model(Step.tree(tokens, parents, start), full))
            full.keep_path(start, path)
            retrieval.sync()
        return logits, full.keys[:, :, : full.length], full.values[:, :, : full.length], list(full.last_query)
    finally:
        model.fused_layers = saved


@pytest.mark.parametrize("int8", [False, True])  # the retrieval tier's int8 twin (models/quantized.py)
@pytest.mark.parametrize("arch", ["llama2", "qwen2"])  # qwen2: q, k, v biases
def test_fused_layers_equal_the_layer_loop_bit_for_bit(level, tmp_path, arch, int8, monkeypatch):
    folder = write_tiny_checkpoint(tmp_path / arch, arch, vocab_size=96, hidden_size=256, num_heads=4, num_kv_heads=2,
                                   scale=10.0)
    model = load_model(folder, "bfloat16")
    if int8:
        model = int8_twin(model)
    assert model.fused_layers.max_rows >= 7
    calls = []
    ext = cpu_kernels()
    real = ext.decoder_layers_bf16
    monkeypatch.setattr(ext, "decoder_layers_bf16", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    fused = decode(model, model.fused_layers)
    # every forward took it; the prefill too where attention takes its rows
    assert sorted(set(calls)) == [1, 2, 3, 4, 7] + ([prefill_rows()] if prefill_fused() else [])
    calls.clear()
    plain = decode(model, None)
    assert not calls
    for got, want in zip(fused[0], plain[0]):
        assert torch.equal(got, want)
    assert torch.equal(fused[1], plain[1]) and torch.equal(fused[2], plain[2])
    for got, want in zip(fused[3], plain[3]):
        assert torch.equal(got, want)


def decode_streaming(model, fused):
    """A draft's streaming cache (4 sinks, a window of 12, a store of 2 x (12 + 8) entries) through a
    prefill, a skip, chains and trees that slide the window past compactions of the store, rollbacks and
    kept paths; then batches beside a fresh streaming cache whose sinks are not full (it declines the
    fused loop, so both run the layer loop) between forwards of its own. Returns every forward's logits
    and the caches' stored keys."""
    saved = model.fused_layers
    model.fused_layers = fused
    try:
        g = torch.Generator().manual_seed(2)
        cache = StreamingKVCache(model.config, 4, 12, 8, model.rope, model.dtype, "cpu")
        logits = [model(torch.randint(3, 96, (30,), generator=g), cache)]
        cache.skip(20)
        for i, n in enumerate((1, 3, 5, 2, 1, 4) * 4):
            logits.append(model(torch.randint(3, 96, (n,), generator=g), cache))
            if i % 6 == 4 and i > 6:  # a draft's rejected proposals: the next forward begins two tokens before
                cache.rollback(3)  # the last one did, so its window takes back entries that had left it
        cache.rollback(3)
        for parents, path in (([-1, 0, 0, 1, 2, 2, 3], [0, 2, 5]), ([-1, -1, 0, 1], [1, 3])):
            tokens, start = torch.randint(3, 96, (len(parents),), generator=g), cache.length
            logits.append(model(Step.tree(tokens, parents, start), cache))
            cache.keep_path(start, path)
            logits.append(model(torch.randint(3, 96, (2,), generator=g), cache))
        fresh = StreamingKVCache(model.config, 4, 12, 8, model.rope, model.dtype, "cpu")
        steps = [Step.chain(torch.randint(3, 96, (2,), generator=g), c.length) for c in (cache, fresh)]
        logits += model.forward_batch(steps, [cache, fresh])
        for n in (1, 3):  # the layer loop wrote the store alone: the view must take those entries from it
            logits.append(model(torch.randint(3, 96, (n,), generator=g), cache))
            steps = [Step.chain(torch.randint(3, 96, (1,), generator=g), c.length) for c in (cache, fresh)]
            logits += model.forward_batch(steps, [cache, fresh])
        logits.append(model(torch.randint(3, 96, (2,), generator=g), cache))
        return logits, cache.recent_k.clone(), cache.sink_k.clone()
    finally:
        model.fused_layers = saved


def test_a_streaming_cache_takes_the_fused_loop_bit_for_bit(level, tmp_path, monkeypatch):
    """Past its sinks, a draft's forwards of a few tokens run the fused loop over the streaming cache's
    sinks and window (a view that mirrors the store) and store what the layer loop stores."""
    model = load_model(write_tiny_checkpoint(tmp_path, vocab_size=96, hidden_size=256, num_heads=4, num_kv_heads=2,
                                             scale=10.0), "bfloat16")
    calls = []
    ext = cpu_kernels()
    real = ext.decoder_layers_bf16
    monkeypatch.setattr(ext, "decoder_layers_bf16", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    fused = decode_streaming(model, model.fused_layers)
    # every forward but the prefill (it fills the sinks) and the batch beside a cache whose sinks are not full
    assert calls == [1, 3, 5, 2, 1, 4] * 4 + [7, 2, 4, 2, 1, 3, 2]
    plain = decode_streaming(model, None)
    for got, want in zip(fused[0], plain[0]):
        assert torch.equal(got, want)
    assert torch.equal(fused[1], plain[1]) and torch.equal(fused[2], plain[2])


def test_float32_models_take_the_layer_loop(tmp_path):
    model = load_model(write_tiny_checkpoint(tmp_path, hidden_size=256, num_heads=4), "float32")
    assert model.fused_layers.max_rows == 0


def decode_batch(model, fused):
    """Two full caches and a static retrieval cache (on a third) stepped together: chains and trees of 1
    to 5 tokens per sequence in one forward. Returns every forward's logits and the caches' contents."""
    saved = model.fused_layers
    model.fused_layers = fused
    try:
        g = torch.Generator().manual_seed(1)
        fulls = [FullKVCache(model.config, 128, model.dtype, "cpu") for _ in range(3)]
        for full, n in zip(fulls, (30, 45, 52)):
            model(torch.randint(3, 96, (n,), generator=g), full, logits_for="none")
        retrieval = RetrievalKVCache(LocalKVSource(fulls[2]), 16, 4, "static", full_layers=1, refresh_every=10,
                                     max_speculative=40)
        retrieval.sync()
        caches, logits = [fulls[0], fulls[1], retrieval], []
        chain = lambda n: list(range(-1, n - 1))  # noqa: E731
        for shapes in (([-1], [-1, 0, 1], [-1, 0, 0, 1]), ([-1, 0, 0, 1, 1], [-1], [-1, 0]),
                       (chain(52), chain(48), chain(30))):  # 130 rows: past the linear kernel's one call at every level
            steps = [Step.tree(torch.randint(3, 96, (len(p),), generator=g), p, c.length)
                     for p, c in zip(shapes, caches)]
            logits += model.forward_batch(steps, caches)
        return logits, [f.keys[:, :, :f.length] for f in fulls[:2]], [list(f.last_query) for f in fulls[:2]]
    finally:
        model.fused_layers = saved


@pytest.mark.parametrize("pieced", [None, 100])
def test_fused_batches_equal_the_layer_loop_bit_for_bit(level, tmp_path, monkeypatch, pieced):
    """A forward of 130 rows takes the linear kernel in pieces (pieced_max_rows: 192), or with `pieced` 100
    torch's product past them, where the fused loop calls it too if bfloat16 is native (else the layer
    loop runs that forward)."""
    if pieced:
        monkeypatch.setattr(linear, "PIECED_MAX_ROWS", pieced)
    model = load_model(write_tiny_checkpoint(tmp_path, vocab_size=96, hidden_size=256, num_heads=4, num_kv_heads=2,
                                             scale=10.0), "bfloat16")
    calls = []
    ext = cpu_kernels()
    real = ext.decoder_layers_bf16
    monkeypatch.setattr(ext, "decoder_layers_bf16", lambda *a: calls.append(a[5]) or real(*a))
    fused = decode_batch(model, model.fused_layers)
    # the batched forwards took it, whole; 130 rows in pieces, or past them where bfloat16 is native
    batched = [rows for rows in calls if len(rows) > 1]  # (the prefills may take it too)
    takes_130 = native_bf16() or linear.pieced_max_rows() >= 130
    assert batched == [[1, 3, 4], [5, 1, 2]] + ([[52, 48, 30]] if takes_130 else [])
    plain = decode_batch(model, None)
    for got, want in zip(fused[0], plain[0]):
        assert torch.equal(got, want)
    for got, want in zip(fused[1] + fused[2][0] + fused[2][1], plain[1] + plain[2][0] + plain[2][1]):
        assert torch.equal(got, want)
