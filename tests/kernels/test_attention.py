from types import SimpleNamespace

import pytest
import torch

import triforce.kernels.attention as attention_module
from triforce.kernels.attention import attention, kernel_max_rows, reference_attention
from triforce.kernels.cpu import cpu_kernels, has_amx
from triforce.kernels.retrieval import chunk_mean_keys, chunk_token_ids, gather_tokens, select_chunks
from triforce.step import ancestor_mask


def random_mask(n, m, g):
    """[n, m] bool over the last m keys: a random tree's ancestor mask among the n new tokens, and random
    visibility of the m - n entries before them."""
    parents = [int(torch.randint(-1, i, (), generator=g)) if i else -1 for i in range(n)]
    earlier = torch.rand(n, m - n, generator=g) < 0.5
    return torch.cat((earlier, ancestor_mask(parents)), dim=1)


def count_splits(monkeypatch) -> list:
    """A list that gains an entry each time `attention` takes the split flash passes."""
    splits = []
    real = attention_module._split_attention
    monkeypatch.setattr(attention_module, "_split_attention", lambda *a: splits.append(1) or real(*a))
    return splits


@pytest.fixture(params=["dense", "split", "matmul"])
def torch_path(request, monkeypatch):
    """Which float32 torch path `attention` takes for several new tokens: one masked SDPA pass, or the split
    flash passes (a threshold on the mask's size picks one on CPU; here each is forced), or CUDA's plain
    matmuls (forced onto the CPU)."""
    monkeypatch.setattr(attention_module, "DENSE_MASK_ENTRIES", 1 << 62 if request.param != "split" else 0)
    if request.param == "matmul":
        monkeypatch.setattr(attention_module, "takes_matmul", lambda *a: True)
        monkeypatch.setattr(attention_module.F, "scaled_dot_product_attention", None)  # must not be called
    return SimpleNamespace(name=request.param, splits=count_splits(monkeypatch))


def test_small_float32_masks_take_one_pass_and_large_ones_the_split_passes(monkeypatch):
    """Torch's float32 paths, as a CPU without the kernels (or a head dim they lack) takes them."""
    monkeypatch.setattr(attention_module, "kernel_max_rows", lambda: 0)
    splits = count_splits(monkeypatch)
    for s, split in ((1000, False), (2000, True)):  # 3 x 16 x S mask entries: under 2^16, then over
        q, k, v = torch.randn(9, 16, 64), torch.randn(3, s, 64), torch.randn(3, s, 64)
        torch.testing.assert_close(attention(q, k, v, 0.125), reference_attention(q, k, v, 0.125),
                                   atol=1e-5, rtol=1e-5)
        assert bool(splits) == split
        splits.clear()


@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 2), (9, 3), (6, 1)])
@pytest.mark.parametrize("n,s", [(1, 1), (1, 37), (5, 5), (7, 40)])
def test_attention_matches_loop_reference(hq, hkv, n, s, torch_path):
    q, k, v = torch.randn(hq, n, 16), torch.randn(hkv, s, 16), torch.randn(hkv, s, 16)
    torch.testing.assert_close(attention(q, k, v, 0.25), reference_attention(q, k, v, 0.25), atol=1e-5, rtol=1e-5)
    assert bool(torch_path.splits) == (torch_path.name == "split" and n > 1)


def test_reference_attention_reads_a_mask_as_the_keys_each_query_sees():
    """A masked row equals plain attention over exactly the keys it sees; a causal mask equals no mask."""
    g = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(6, 5, 16, generator=g), torch.randn(3, 30, 16, generator=g), torch.randn(3, 30, 16, generator=g)
    mask = random_mask(5, 9, g)
    out = reference_attention(q, k, v, 0.25, mask)
    for i in range(5):
        keep = torch.cat((torch.ones(21, dtype=torch.bool), mask[i]))
        alone = reference_attention(q[:, i:i + 1], k[:, keep], v[:, keep], 0.25, torch.ones(1, 1, dtype=torch.bool))
        torch.testing.assert_close(out[:, i:i + 1], alone)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    torch.testing.assert_close(reference_attention(q, k, v, 0.25, causal), reference_attention(q, k, v, 0.25))


@pytest.mark.parametrize("hq,hkv", [(4, 4), (9, 3), (6, 1)])
@pytest.mark.parametrize("n,m,s", [(1, 4, 20), (5, 5, 5), (5, 5, 40), (7, 12, 40), (16, 16, 300)])
def test_attention_with_a_mask_matches_loop_reference(hq, hkv, n, m, s, torch_path):
    """The torch paths (float32): the masked tail merged with the unmasked past, and SDPA for one row or
    under the threshold."""
    g = torch.Generator().manual_seed(n * 100 + m + s)
    q, k, v = torch.randn(hq, n, 16, generator=g), torch.randn(hkv, s, 16, generator=g), torch.randn(hkv, s, 16, generator=g)
    mask = random_mask(n, m, g)
    torch.testing.assert_close(attention(q, k, v, 0.25, mask), reference_attention(q, k, v, 0.25, mask),
                               atol=1e-5, rtol=1e-5)
    assert bool(torch_path.splits) == (torch_path.name == "split" and n > 1)


def fake_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, return_attn_probs=False):
    """flash-attn 2's `flash_attn_func` as its docstring defines it, in float32 torch: q [B, n, Hq, D], k, v
    [B, s, Hkv, D] of one half-precision dtype, the last dimension contiguous, query head h reading KV head
    h // (Hq / Hkv); scale D^-0.5 unless given; `causal` aligned to the bottom right (query i sees keys
    j <= i + s - n); out [B, n, Hq, D] in q's dtype, and with `return_attn_probs` (out, softmax_lse
    [B, Hq, n] float32, S_dmask)."""
    n, hq, s, hkv = q.shape[1], q.shape[2], k.shape[1], k.shape[2]
    assert q.dtype == k.dtype == v.dtype and q.dtype in (torch.float16, torch.bfloat16), "flash-attn refuses these"
    assert q.stride(-1) == k.stride(-1) == v.stride(-1) == 1 and hq % hkv == 0, "flash-attn refuses these"
    softmax_scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    keys, values = (t.float().repeat_interleave(hq // hkv, dim=2) for t in (k, v))
    scores = torch.einsum("bnhd,bshd->bhns", q.float(), keys) * softmax_scale
    if causal:
        scores = scores.masked_fill(torch.arange(s) > torch.arange(n)[:, None] + (s - n), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("bhns,bshd->bnhd", torch.exp(scores - lse[..., None]), values).to(q.dtype)
    return (out, lse, None) if return_attn_probs else out


@pytest.mark.parametrize("n,m,s", [(1, None, 40), (5, None, 40), (5, 9, 40), (7, 7, 7)])
def test_the_flash_attn_branch_gives_the_reference(n, m, s, monkeypatch):
    """What `attention` does around flash-attn on a GPU (layouts, GQA heads, the causal tail, a tree's
    masked tail merged by log-sum-exps), run on the CPU with flash-attn's function written out: a chain
    calls it once, a tree's mask over the last m < s keys runs its unmasked pass over the keys before
    them, and a mask over every key (a CUDA graph's) goes to SDPA (here in float32, as a CPU without the
    kernels or AVX512-BF16 runs it)."""
    monkeypatch.setattr(attention_module, "kernel_takes", lambda *a: False)
    monkeypatch.setattr(attention_module, "native_bf16", lambda: False)
    calls = []
    monkeypatch.setattr(attention_module, "_flash_attn_func",
                        lambda *a, **kw: calls.append(kw) or fake_flash_attn_func(*a, **kw))
    real = attention_module.takes_flash_attn
    monkeypatch.setattr(attention_module, "ampere_or_newer", lambda device: True)
    monkeypatch.setattr(attention_module, "takes_flash_attn",  # q on CUDA: the one condition a CPU cannot meet
                        lambda q, mask, keys: real(SimpleNamespace(is_cuda=True, dtype=q.dtype, device="cuda:0"),
                                                   mask, keys))
    splits = count_splits(monkeypatch)
    g = torch.Generator().manual_seed(n + s)
    q, k, v = (torch.randn(6, n, 64, generator=g).bfloat16(), torch.randn(2, s, 64, generator=g).bfloat16(),
               torch.randn(2, s, 64, generator=g).bfloat16())
    mask = None if m is None else random_mask(n, m, g)
    torch.testing.assert_close(attention(q, k, v, 0.1, mask).float(),  # a scale other than D^-0.5: it is passed
                               reference_attention(q, k, v, 0.1, mask).float(), atol=2e-2, rtol=2e-2)
    assert [kw["causal"] for kw in calls] == ([True] if m is None else [False] if m < s else [])
    assert len(splits) == (m is not None and m < s)


def test_attention_bfloat16_close_to_reference():
    q, k, v = (torch.randn(9, 4, 64).bfloat16(), torch.randn(3, 300, 64).bfloat16(), torch.randn(3, 300, 64).bfloat16())
    ref = reference_attention(q.float(), k.float(), v.float(), 0.125)
    torch.testing.assert_close(attention(q, k, v, 0.125).float(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk", [1, 3, 8])
def test_chunk_mean_keys_are_the_float32_means_of_a_caches_view(dtype, chunk):
    """The chunk means, summed a position at a time in float32 (no float32 copy of the keys), over the
    strided view of a cache buffer that a rebuild passes: the float64 means to float32's rounding, in the
    keys' dtype; and the buffer as it was (float32 keys' first position was a view, summed into)."""
    g = torch.Generator().manual_seed(chunk)
    buffer = torch.randn(2, 3, 10 * chunk + 5, 16, generator=g).to(dtype)  # [L, Hkv, capacity, D]
    before, view = buffer.clone(), buffer[:, :, chunk:9 * chunk]
    exact = view.double().reshape(2, 3, 8, chunk, 16).mean(dim=-2)
    means = chunk_mean_keys(view, chunk)
    assert not view.is_contiguous() and means.dtype == dtype and torch.equal(buffer, before)
    torch.testing.assert_close(means.double(), exact.to(dtype).double(), rtol=0, atol=1e-6 if dtype == torch.float32
                               else 1e-2)


def test_select_chunks_matches_a_loop():
    hq, hkv, d, chunk, c = 6, 2, 8, 4, 12
    keys, queries = torch.randn(hkv, c * chunk, d), torch.randn(hq, 3, d)
    means = chunk_mean_keys(keys, chunk)
    chosen = select_chunks(queries, means, 5)
    for h in range(hkv):
        scores = [sum(float(queries[g, r] @ keys[h, i * chunk:(i + 1) * chunk].mean(0))
                      for g in range(h * 3, h * 3 + 3) for r in range(3)) for i in range(c)]
        scores[0] = scores[-1] = float("inf")
        expected = sorted(sorted(range(c), key=lambda i: -scores[i])[:5])
        assert sorted(chosen[h].tolist()) == expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_select_chunks_for_several_layers_at_once_is_each_layers_own(dtype):
    """A static rebuild chooses every layer's chunks in one call (a leading layer dim), over the slice of a
    means buffer that holds more chunks than are complete, as ChunkMeans hands it over."""
    hq, hkv, d, c = 6, 2, 64, 40
    buffer = torch.randn(5, hkv, c + 8, d).to(dtype)
    means, queries = buffer[:, :, :c], torch.randn(5, hq, 1, d).to(dtype)
    chosen = select_chunks(queries, means, 7)
    assert chosen.shape == (5, hkv, 7)
    for layer in range(5):
        assert torch.equal(chosen[layer].sort().values, select_chunks(queries[layer], means[layer], 7).sort().values)
        assert {0, c - 1} <= set(chosen[layer, 0].tolist())


def test_gather_chunks_takes_whole_chunks_per_head():
    data = torch.arange(2 * 12, dtype=torch.float32).view(2, 12, 1)
    (out,) = gather_tokens(chunk_token_ids(torch.tensor([[0, 2], [1, 2]]), 4), data)
    assert out[0, :, 0].tolist() == [0, 1, 2, 3, 8, 9, 10, 11]
    assert out[1, :, 0].tolist() == [16, 17, 18, 19, 20, 21, 22, 23]


@pytest.mark.parametrize("amx", [False, True])
@pytest.mark.parametrize("hq,hkv,d", [(9, 3, 64), (4, 4, 128), (8, 1, 64), (8, 8, 64)])
@pytest.mark.parametrize("n,s", [(1, 1), (1, 3000), (7, 7), (6, 1500), (16, 700), (3, 65), (7, 33)])
def test_cpu_decode_attention_kernel_matches_reference(level, hq, hkv, d, n, s, amx):
    """At every level, the vector path (AVX2 or AVX512-BF16) and the AMX path, at ranges whose ends fall
    inside a block, rows past 16, and as many KV heads as query heads."""
    if amx and not has_amx():
        pytest.skip("no AMX tiles at this level")
    g = torch.Generator().manual_seed(n * 1000 + s)
    q = (2 * torch.randn(hq, n, d, generator=g)).bfloat16()
    cache_k = torch.randn(hkv, s + 50, d, generator=g).bfloat16()  # a cache longer than what is read:
    cache_v = torch.randn(hkv, s + 50, d, generator=g).bfloat16()  # strided heads, as the caches hand over
    k, v = cache_k[:, :s], cache_v[:, :s]
    got = cpu_kernels().decode_attention_bf16(q, k, v, d ** -0.5, allow_amx=amx).float()
    want = reference_attention(q.float(), k.float(), v.float(), d ** -0.5).float()
    torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-2)
    if (hq // hkv) * n <= kernel_max_rows() and amx == has_amx():  # the dispatcher's path
        torch.testing.assert_close(attention(q, k, v, d ** -0.5).float(), got)


def vector_attention(q, k, v, scale, mask=None):
    """The CPU kernel's vector path for q's dtype: bfloat16 (AVX2 or AVX512-BF16) or float32 (AVX2)."""
    if q.dtype == torch.float32:
        return cpu_kernels().decode_attention_f32(q, k, v, scale, mask)
    return cpu_kernels().decode_attention_bf16(q, k, v, scale, allow_amx=False, mask=mask)


def assert_steps_give_the_check(check, q, k, v, scale):
    """Each of a chain check's n tokens (check: vector_attention(q, k, v, scale)) equals, bit for bit, a
    one-token step over the keys up to its own."""
    n, s = q.size(1), k.size(1)
    for i in range(n):
        step = vector_attention(q[:, i:i + 1].contiguous(), k[:, :s - n + i + 1], v[:, :s - n + i + 1], scale)
        assert torch.equal(check[:, i:i + 1], step), i


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("n,s", [(7, 700), (7, 510), (7, 1027), (24, 1600), (5, 300)])
def test_cpu_decode_attention_kernel_gives_a_check_what_steps_give(level, n, s, d, dtype):
    """A chain check of n tokens over s keys gives each token, bit for bit, the attention of a one-token
    step over the keys up to its own: the kernel splits the keys at fixed offsets (every 512), not at
    offsets sized by s, so checks whose steps straddle one (512, 1024) sum in the same order. The vector
    paths, and the float32 kernel (where torch's paths differed in the last bits)."""
    g = torch.Generator().manual_seed(s)
    q = (2 * torch.randn(9, n, d, generator=g)).to(dtype)
    k, v = torch.randn(3, s, d, generator=g).to(dtype), torch.randn(3, s, d, generator=g).to(dtype)
    check = vector_attention(q, k, v, d ** -0.5)
    assert check.dtype == dtype
    assert_steps_give_the_check(check, q, k, v, d ** -0.5)


def test_a_flash_attn_older_than_2_1_or_broken_is_not_taken(monkeypatch):
    """Before 2.1 flash-attn aligns its causal mask top-left where queries are fewer than keys (a prefill
    chunk, a chain check): wrong logits without an error. A build for another torch fails to import with
    undefined symbols (an OSError or ImportError, or worse): SDPA runs then too. (No GPU here: modules faked.)"""
    import sys
    import types

    def fake(version):
        module = types.ModuleType("flash_attn")
        module.__version__, module.flash_attn_func = version, fake_flash_attn_func
        return module

    for version, taken in (("2.0.9", False), ("2.1.0", True), ("2.7.4.post1", True)):
        monkeypatch.setitem(sys.modules, "flash_attn", fake(version))
        assert (attention_module._flash_attn() is fake_flash_attn_func) is taken, version
    broken = types.ModuleType("flash_attn")
    broken.__getattr__ = lambda name: (_ for _ in ()).throw(OSError("undefined symbol: _ZN3c10"))
    monkeypatch.setitem(sys.modules, "flash_attn", broken)
    assert attention_module._flash_attn() is None


def test_flash_attn_is_not_taken_on_a_gpu_older_than_ampere(monkeypatch):
    """flash-attn 2 raises in every forward on a T4 or V100 (compute capability below 8): SDPA runs there."""
    monkeypatch.setattr(attention_module, "_flash_attn_func", lambda *a, **kw: None)
    q = SimpleNamespace(is_cuda=True, dtype=torch.bfloat16, device="cuda:0")
    for capable in (True, False):
        monkeypatch.setattr(attention_module, "ampere_or_newer", lambda device, capable=capable: capable)
        assert attention_module.takes_flash_attn(q, None, 10) is capable


def deep_tree_mask(n, m, g):
    """[n, m] bool over the last m keys: a tree among the n new tokens whose branches run deep (a node's
    parent is the node before it three times in four), and random visibility of the m - n entries before
    them (a tree grown over several forwards), so that a node's keys are scattered among others'."""
    parents = [-1] + [i - 1 if torch.rand((), generator=g) < 0.75 else int(torch.randint(-1, i, (), generator=g))
                      for i in range(1, n)]
    earlier = torch.rand(n, m - n, generator=g) < 0.5
    return torch.cat((earlier, ancestor_mask(parents)), dim=1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("n,m,s", [(7, 7, 700), (12, 12, 515), (16, 20, 1040), (24, 24, 1600), (9, 14, 70),
                                   (8, 8, 520), (7, 7, 71), (1, 6, 40)])
def test_cpu_decode_attention_kernel_gives_a_tree_check_what_steps_give(level, n, m, s, d, dtype):
    """A tree check gives each node, bit for bit, the attention of a one-token step after its path (the
    keys before the tail, then the tail's keys the node sees, adjacent): the kernel runs a node whose keys
    are scattered over a copy of them in that order, the blocks and the 512-key ranges where the step
    has them (here paths straddle 512 and 1024 where the tree's own layout does not, and the reverse;
    keys before the tail a multiple of 512 and of 64, none at all; one new token beside earlier entries)."""
    g = torch.Generator().manual_seed(s + n)
    mask = deep_tree_mask(n, m, g)
    seen = [[t for t in range(m) if mask[i, t]] for i in range(n)]
    assert any(tail != list(range(len(tail))) for tail in seen), "no node's keys are scattered"
    q = (2 * torch.randn(9, n, d, generator=g)).to(dtype)
    k, v = torch.randn(3, s, d, generator=g).to(dtype), torch.randn(3, s, d, generator=g).to(dtype)
    check = vector_attention(q, k, v, d ** -0.5, mask)
    first = s - m
    for i in range(n):
        keys = list(range(first)) + [first + t for t in range(m) if mask[i, t]]
        step = vector_attention(q[:, i:i + 1].contiguous(), k[:, keys].contiguous(), v[:, keys].contiguous(),
                                d ** -0.5)
        assert torch.equal(check[:, i:i + 1], step), i


def count_kernel_calls(monkeypatch) -> list:
    """A list that gains each call's rows (query heads per KV head x new tokens) as `attention` calls the CPU kernel."""
    calls = []
    real = attention_module._kernel
    monkeypatch.setattr(attention_module, "_kernel",
                        lambda q, k, *a: calls.append(q.shape[0] // k.shape[0] * q.shape[1]) or real(q, k, *a))
    return calls


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("hq,hkv,d,n,m,s", [(9, 3, 64, 100, None, 1100), (9, 3, 64, 130, None, 130),
                                            (9, 3, 64, 60, 70, 600), (8, 1, 128, 40, None, 700),
                                            (8, 1, 128, 20, 26, 300)])
def test_more_rows_than_the_kernel_takes_run_it_in_pieces_and_get_what_steps_get(level, hq, hkv, d, n, m, s, dtype,
                                                                                 monkeypatch):
    """A prefill chunk (a chain of 100 or 130 tokens, 300-390 rows per KV head: past the kernel's 128) or a
    tree of 60 nodes runs the kernel in pieces of new tokens (128 // G tokens each), not torch's paths: each
    token gets, bit for bit, the attention of a one-token step after its path, and the reference's within
    rounding. (bfloat16 at the AVX2 level keeps torch's float32 pass, as fast there.)"""
    calls = count_kernel_calls(monkeypatch)
    g = torch.Generator().manual_seed(n + s)
    mask = None if m is None else deep_tree_mask(n, m, g)
    q = (2 * torch.randn(hq, n, d, generator=g)).to(dtype)
    k, v = torch.randn(hkv, s, d, generator=g).to(dtype), torch.randn(hkv, s, d, generator=g).to(dtype)
    got = attention(q, k, v, d ** -0.5, mask)
    pieces = dtype == torch.float32 or level != "avx2"
    piece = kernel_max_rows() // (hq // hkv)
    assert got.dtype == dtype and calls == ([hq // hkv * min(piece, n - a) for a in range(0, n, piece)] if pieces else [])
    calls.clear()
    first = s - (n if m is None else m)
    for i in range(n if pieces else 0):
        keys = list(range(first)) + [first + t for t in range(s - first) if (t <= i if m is None else mask[i, t])]
        step = attention(q[:, i:i + 1].contiguous(), k[:, keys].contiguous(), v[:, keys].contiguous(), d ** -0.5)
        assert torch.equal(got[:, i:i + 1], step), i
    tolerance = 1e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got.float(), reference_attention(q.float(), k.float(), v.float(), d ** -0.5, mask).float(),
                               atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m", [None, 34])
def test_a_forward_in_pieces_gives_every_token_what_one_call_gives_it(level, dtype, m, monkeypatch):
    """With the dispatcher's rows cut to 24 (8 tokens of 3 query heads per KV head), a chain or a tree of 30
    new tokens (90 rows: one call of the kernel, whose own limit is 128) runs in four pieces, and every
    token's attention equals, bit for bit, what the kernel gives it in one call over all of them, nodes whose
    keys are scattered and pieces whose rows all see a prefix of the new tokens alike."""
    if dtype == torch.bfloat16 and level == "avx2":
        pytest.skip("bfloat16 at the AVX2 level keeps torch's pass")
    g = torch.Generator().manual_seed(30 + (m or 0))
    mask = None if m is None else deep_tree_mask(30, m, g)
    q = (2 * torch.randn(9, 30, 64, generator=g)).to(dtype)
    k, v = torch.randn(3, 700, 64, generator=g).to(dtype), torch.randn(3, 700, 64, generator=g).to(dtype)
    whole = attention_module._kernel(q, k, v, 0.125, mask)
    calls = count_kernel_calls(monkeypatch)
    monkeypatch.setattr(attention_module, "kernel_max_rows", lambda: 24)
    assert torch.equal(attention(q, k, v, 0.125, mask), whole)
    assert calls == [24, 24, 24, 18]


def test_a_mask_that_lets_a_token_see_a_later_one_is_not_cut_into_pieces(level, monkeypatch):
    """Pieces drop the keys past their last token; a mask where a row sees a later new token (no chain's or
    tree's) takes torch's path, which reads it whole."""
    splits = count_splits(monkeypatch)
    g = torch.Generator().manual_seed(5)
    mask = torch.rand(60, 60, generator=g) < 0.5
    mask.fill_diagonal_(True)
    q, k, v = torch.randn(9, 60, 64, generator=g), torch.randn(3, 400, 64, generator=g), torch.randn(3, 400, 64, generator=g)
    torch.testing.assert_close(attention(q, k, v, 0.125, mask), reference_attention(q, k, v, 0.125, mask),
                               atol=1e-5, rtol=1e-5)
    assert splits


@pytest.mark.parametrize("hq,hkv,d", [(9, 3, 64), (4, 4, 128), (8, 1, 64)])
@pytest.mark.parametrize("n,m,s", [(1, 1, 1), (1, 5, 40), (7, 7, 1300), (16, 30, 700), (5, 33, 33)])
def test_cpu_float32_attention_kernel_matches_reference(level, hq, hkv, d, n, m, s):
    """The float32 kernel (every level) against the float64 loop, chains and masks; `attention` takes it
    for float32 on the CPU."""
    g = torch.Generator().manual_seed(n * 100 + m + s)
    q, k, v = torch.randn(hq, n, d, generator=g), torch.randn(hkv, s, d, generator=g), torch.randn(hkv, s, d, generator=g)
    for mask in (None, random_mask(n, m, g)):
        got = cpu_kernels().decode_attention_f32(q, k, v, d ** -0.5, mask)
        want = reference_attention(q.double(), k.double(), v.double(), d ** -0.5, mask)
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
        assert torch.equal(attention(q, k, v, d ** -0.5, mask), got)


@pytest.mark.parametrize("amx", [False, True])
@pytest.mark.parametrize("hq,hkv,d", [(9, 3, 64), (4, 4, 128), (8, 1, 64)])
@pytest.mark.parametrize("n,m,s", [(1, 5, 40), (7, 7, 7), (6, 6, 1500), (16, 30, 700), (5, 33, 33), (3, 3, 65)])
def test_cpu_decode_attention_kernel_with_a_mask_matches_reference(level, hq, hkv, d, n, m, s, amx):
    """Tree masks at every level and path: masked keys inside one block and across block and range ends."""
    if amx and not has_amx():
        pytest.skip("no AMX tiles at this level")
    if (hq // hkv) * n > 128:
        pytest.skip("more rows than the kernel takes")
    g = torch.Generator().manual_seed(n * 1000 + m + s)
    q = (2 * torch.randn(hq, n, d, generator=g)).bfloat16()
    k, v = torch.randn(hkv, s, d, generator=g).bfloat16(), torch.randn(hkv, s, d, generator=g).bfloat16()
    mask = random_mask(n, m, g)
    got = cpu_kernels().decode_attention_bf16(q, k, v, d ** -0.5, allow_amx=amx, mask=mask).float()
    want = reference_attention(q.float(), k.float(), v.float(), d ** -0.5, mask).float()
    torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-2)
    if (hq // hkv) * n <= kernel_max_rows() and amx == has_amx():  # the dispatcher's path
        torch.testing.assert_close(attention(q, k, v, d ** -0.5, mask).float(), got)


@pytest.mark.parametrize("amx", [False, True])
def test_a_batch_of_sequences_gets_what_each_gets_alone(level, amx):
    """decode_attention_batch_bf16 (the fused layer loop's: every sequence's ranges in one pass over the
    threads) gives each sequence, bit for bit, what decode_attention_bf16 gives it alone: chains and trees,
    one row or many, contexts within one key range and across many, both head dims' model shapes. (The
    single entry is a batch of one of the same code: this catches mistakes across sequences; what a row
    computes is held by the reference below and by the step-equality tests above.)"""
    if amx and not has_amx():
        pytest.skip("no AMX tiles at this level")
    g = torch.Generator().manual_seed(5)
    for hq, hkv, d in ((9, 3, 64), (4, 2, 128)):
        shapes = [(1, None, 3000), (7, None, 700), (5, 9, 1300), (1, None, 40), (12, 12, 515), (3, None, 65)]
        qs, ks, vs, masks = [], [], [], []
        for n, m, s in shapes:
            qs.append((2 * torch.randn(hq, n, d, generator=g)).bfloat16())
            cache_k, cache_v = (torch.randn(hkv, s + 20, d, generator=g).bfloat16() for _ in range(2))
            ks.append(cache_k[:, :s])
            vs.append(cache_v[:, :s])
            masks.append(None if m is None else random_mask(n, m, g))
        together = cpu_kernels().decode_attention_batch_bf16(qs, ks, vs, d ** -0.5, allow_amx=amx, masks=masks)
        assert len(together) == len(shapes)
        for q, k, v, mask, got in zip(qs, ks, vs, masks, together):
            alone = cpu_kernels().decode_attention_bf16(q, k, v, d ** -0.5, allow_amx=amx, mask=mask)
            assert torch.equal(got, alone)
            want = reference_attention(q.float(), k.float(), v.float(), d ** -0.5, mask).float()
            torch.testing.assert_close(got.float(), want, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_row_that_sees_no_key_is_zeros_as_in_the_reference(level, dtype):
    """A mask that hides every key from a row (the model never sends one: every row sees itself) gives
    that row zeros, as an empty softmax times V does in the reference; the kernels' merge divided 0 by 0."""
    g = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(2, 2, 64, generator=g), torch.randn(1, 40, 64, generator=g), torch.randn(1, 40, 64, generator=g)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    mask = torch.zeros(2, 40, dtype=torch.bool)
    mask[1, :9] = True  # the second row sees nine keys, the first none
    run = cpu_kernels().decode_attention_f32 if dtype == torch.float32 else \
        lambda *a: cpu_kernels().decode_attention_bf16(*a[:4], False, a[4])
    got = run(q, k, v, 0.125, mask).float()
    want = reference_attention(q.float(), k.float(), v.float(), 0.125, mask).float()
    assert torch.equal(got[:, 0], torch.zeros_like(got[:, 0]))
    torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-2)


def test_cpu_decode_attention_kernel_refuses_a_bad_mask(level):
    q, k, v = torch.randn(3, 4, 64).bfloat16(), torch.randn(1, 10, 64).bfloat16(), torch.randn(1, 10, 64).bfloat16()
    for bad in (torch.ones(4, 3, dtype=torch.bool), torch.ones(4, 11, dtype=torch.bool), torch.ones(4, 4)):
        with pytest.raises(RuntimeError, match="mask"):
            cpu_kernels().decode_attention_bf16(q, k, v, 0.125, mask=bad)


def test_cpu_decode_attention_kernel_refuses_keys_of_no_head(level):
    """k and v of no KV head: a RuntimeError like every bad shape's (hq % 0 ended the process with SIGFPE)."""
    q, k = torch.randn(2, 1, 64).bfloat16(), torch.randn(0, 4, 64).bfloat16()
    with pytest.raises(RuntimeError, match="heads / rows"):
        cpu_kernels().decode_attention_bf16(q, k, k.clone(), 0.125)
    with pytest.raises(RuntimeError, match="heads / rows"):
        cpu_kernels().decode_attention_f32(q.float(), k.float(), k.float(), 0.125)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA only")
@pytest.mark.parametrize("n", [1, 5])
def test_cuda_float32_checks_take_plain_matmuls_and_match_the_reference(n, monkeypatch):
    """On CUDA, float32 decode steps and checks avoid SDPA's memory-efficient kernel (one block per KV head
    over every key); prefill chunks keep it."""
    calls = []
    real = attention_module._matmul_attention
    monkeypatch.setattr(attention_module, "_matmul_attention", lambda *a: calls.append(1) or real(*a))
    g = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(9, n, 64, generator=g), torch.randn(3, 3000, 64, generator=g),
               torch.randn(3, 3000, 64, generator=g))
    mask = random_mask(n, 40, g)
    got = attention(q.cuda(), k.cuda(), v.cuda(), 0.125, mask.cuda())
    torch.testing.assert_close(got.cpu(), reference_attention(q, k, v, 0.125, mask), atol=1e-5, rtol=1e-5)
    assert calls
    big = torch.randn(9, 100, 64, generator=g).cuda()
    calls.clear()
    attention(big, k.cuda(), v.cuda(), 0.125)
    assert not calls and not attention_module.takes_matmul(q, 3 * n, 3000, 3)  # 300 rows: SDPA; CPU: never
    assert not attention_module.takes_matmul(q.cuda(), 3, attention_module.MATMUL_MAX_SCORES // 9 + 1, 3)


def test_the_causal_mask_is_kept_between_layers_on_a_cpu_only():
    """Every layer of a forward takes the same [g*n, S] causal mask: kept on a CPU (building it per layer
    cost an 8K prefill 0.9 s), built per layer on other devices (two kept on a GPU held up to a GB after a
    long prompt, which memory admission counted as used); `meta` stands for a GPU."""
    from triforce.kernels.attention import _kept_tail_mask, causal_tail_mask, grouped_tail_mask

    _kept_tail_mask.cache_clear()
    cpu = grouped_tail_mask(3, 7, 2, torch.device("cpu"))
    assert grouped_tail_mask(3, 7, 2, torch.device("cpu")) is cpu
    assert torch.equal(cpu, causal_tail_mask(3, 7, torch.device("cpu")).repeat(2, 1))
    assert grouped_tail_mask(3, 7, 2, torch.device("meta")).shape == (6, 7)
    assert _kept_tail_mask.cache_info().currsize == 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n,s,poisoned", [(8, 130, 100), (7, 1300, 600), (3, 700, 698)])
def test_a_key_scored_minus_infinity_gets_no_weight_in_checks_or_steps(level, dtype, n, s, poisoned):
    """A key whose score is -inf from its values (an infinite element), not from a mask, gets weight 0, as
    in torch's attention, in a check and in each of its steps alike: the avx512 softmax's 2^t once gave it
    2^-125 in a block without hidden keys (a step's) and 0 in a block with some (a check's), so a huge
    value of that key leaked into the steps only."""
    g = torch.Generator().manual_seed(s)
    q = torch.randn(6, n, 64, generator=g).abs().to(dtype)  # q . k = -inf for the poisoned key
    k, v = torch.randn(2, s, 64, generator=g).to(dtype), torch.randn(2, s, 64, generator=g).to(dtype)
    k[1, poisoned, 5], v[1, poisoned, 0] = float("-inf"), 1e38
    check = vector_attention(q, k, v, 0.125)
    want = reference_attention(q.float(), k.float(), v.float(), 0.125)
    assert want.isfinite().all()
    torch.testing.assert_close(check.float(), want, atol=1e-2, rtol=1e-2)
    assert_steps_give_the_check(check, q, k, v, 0.125)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("amx", [False, True])
@pytest.mark.parametrize("n,s,poisoned", [(1, 40, 7), (7, 1300, 600), (3, 700, 698), (1, 3000, 2999), (1, 513, 512),
                                         (2, 1026, 1024)])
def test_a_nan_key_or_value_gives_nan_where_torch_does(level, dtype, amx, n, s, poisoned):
    """A key or value of NaN (a token whose activations overflowed) makes NaN the output of every row that
    sees it, as torch's attention does: the kernels' softmax had dropped NaN scores as if masked, and the
    request's logits came out finite, a silent wrong answer where the model had overflowed; and a NaN key
    alone in a range of 512 keys (513, 1026) gave a vector max of -inf, "every key masked". (A value of NaN
    makes the check's earlier rows NaN too, which torch's do not: their weight 0 times NaN. Left: it fails
    a request whose model overflowed on a proposal, never answers wrongly.)"""
    if amx and (not has_amx() or dtype == torch.float32):
        pytest.skip("no AMX tiles at this level (or float32, which has none)")
    g = torch.Generator().manual_seed(s)
    q = torch.randn(6, n, 64, generator=g).to(dtype)
    for poison in ("key", "value"):
        k, v = torch.randn(2, s, 64, generator=g).to(dtype), torch.randn(2, s, 64, generator=g).to(dtype)
        (k if poison == "key" else v)[1, poisoned, 5] = float("nan")
        if dtype == torch.float32:
            got = cpu_kernels().decode_attention_f32(q, k, v, 0.125, None)
        else:
            got = cpu_kernels().decode_attention_bf16(q, k, v, 0.125, allow_amx=amx)
        want = reference_attention(q.float(), k.float(), v.float(), 0.125)
        sees = torch.arange(n) + s - n >= poisoned  # the rows (of every query head) after the poisoned key
        assert want[3:, sees].isnan().any(-1).all() and not want[:3].isnan().any(), poison
        nan, want_nan = got.isnan().any(-1), want.isnan().any(-1)
        assert torch.equal(nan, want_nan) if poison == "key" else bool((nan | ~want_nan).all()), poison
