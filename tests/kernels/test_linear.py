import pytest
import torch

from triforce.kernels.attention import attention, reference_attention
from triforce.kernels.cpu import cpu_kernels, has_amx
import triforce.kernels.linear as linear_module
from triforce.kernels.linear import kernel_max_rows, linear, logits_linear, pieced_max_rows, reference_linear


@pytest.mark.parametrize("amx", [False, True])
@pytest.mark.parametrize("n", [1, 2, 5, 6, 7, 8, 9, 11, 16, 21, 40, 88])
@pytest.mark.parametrize("k,out", [(576, 1728), (1536, 576), (64, 3), (96, 80)])
def test_cpu_bf16_kernel_matches_float32_reference(level, n, k, out, amx):
    """At every level: the vector path (AVX2 or AVX512-BF16; 8 rows of x per pass, so 9, 21 and 40 rows
    take several passes over each tile of W, and 1728 rows of W at K = 576 several tiles, the last one
    ragged; AVX512-BF16 takes up to 11 rows in one pass, so 9 and 11 are one there, 16 two pieces of 8; at
    AVX2 from 5 rows three rows of W at a time, 2 rows of x at a time and the odd one alone, and the last one or
    two rows of W of a tile alone: 3, 80 and 576 rows of W are not multiples of 3, nor are some tiles) and
    the AMX path (16 rows per piece, N a multiple of 16: 1728 = 36 blocks of 16, 80 = 5, each block
    prefetching the next but the last; up to four pieces per pass over W, so 88 rows take two passes of
    three pieces, the last one ragged)."""
    if amx and not has_amx():
        pytest.skip("no AMX tiles at this level")
    x, w = torch.randn(n, k).bfloat16(), torch.randn(out, k).bfloat16()
    got, want = cpu_kernels().linear_bf16(x, w, allow_amx=amx).float(), reference_linear(x, w).float()
    # Both accumulate in float32 (in different orders) and round once to bfloat16: one bf16 ulp apart at
    # most, except where terms of size ~sqrt(K) cancel to near zero and the orders' float32 errors show.
    torch.testing.assert_close(got, want, atol=1e-4, rtol=2 ** -7)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 9, 13, 24])
@pytest.mark.parametrize("k,out", [(576, 1728), (1536, 576), (16, 3), (48, 80)])
def test_cpu_float32_kernel_matches_float64_reference(level, n, k, out):
    """At every level the float32 kernel (AVX2 + FMA: one row of W at a time up to 4 rows of x, three from
    5, several passes of 8 from 9) sums in float32 as closely as torch's float32 product does."""
    x, w = torch.randn(n, k), torch.randn(out, k)
    want = (x.double() @ w.double().T)
    got = cpu_kernels().linear_f32(x, w)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, atol=1e-5 * k ** 0.5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cpu_kernel_rows_do_not_depend_on_how_many_share_a_pass(level, dtype):
    """Every count of rows the kernels take sums a row in one order (the vector paths: AVX2 one row of W at
    a time up to 4 rows of x and three from 5, passes of 8 from 9; AVX512-BF16 one row of W at a time, one
    pass up to 11 rows of x and passes of 8 from 12): a
    check of n tokens gives each token the numbers a decode step of that token alone gives, bit for bit,
    so greedy decoding cannot part from plain decoding at a near-tie (nor a request's answer change with
    the requests beside it). 1024 rows of W: not a multiple of 3, so some rows of W go alone, and a
    multiple of 16, which AMX tiles take (16 rows of x per pass from 1 row). Up to the most rows `linear`
    sends the kernel at this level (bfloat16: 96 at the avx2 level, 128 at amx)."""
    most = kernel_max_rows(dtype)
    x, w = torch.randn(most, 576).to(dtype), torch.randn(1024, 576).to(dtype)

    def product(rows):
        if dtype == torch.float32:
            return cpu_kernels().linear_f32(rows, w)
        return cpu_kernels().linear_bf16(rows, w, float_out=True)

    alone = torch.cat([product(row[None]) for row in x])
    for n in range(2, most + 1):
        assert torch.equal(product(x[:n]), alone[:n]), n


@pytest.mark.parametrize("n", [1, 21, 97])
def test_amx_bfloat16_outputs_round_the_float32_sums_as_torch_does(level, n):
    """The tile path's bfloat16 outputs are its float32 sums rounded as c10::BFloat16 rounds one (nearest
    even, infinities kept, NaN as 0x7FC0, what its stores wrote element by element before): its vector
    rounding against `.bfloat16()` of its own float32 outputs, bit for bit where they are numbers (torch's
    vector conversion keeps a NaN's sign), with a NaN row, a sum past float32's range, and whole-number
    sums of 9 to 18 bits, which end on a tie in bfloat16's 8 now and then."""
    if not has_amx():
        pytest.skip("no AMX tiles at this level")
    g = torch.Generator().manual_seed(n)
    x = torch.randint(-40, 40, (n, 576), generator=g).bfloat16()  # integer sums: many end on a tie
    w = torch.randint(-8, 8, (960, 576), generator=g).bfloat16()
    w[5, :] = 2e36
    x[-1, :] = 39  # its sum with row 5 of w passes float32's range: +inf
    if n > 1:
        x[0, 7] = float("nan")
    wide = cpu_kernels().linear_bf16(x, w, float_out=True, allow_amx=True)
    rounded = cpu_kernels().linear_bf16(x, w, float_out=False, allow_amx=True)
    assert wide[-1, 5].isposinf() and (n == 1 or wide[0].isnan().all())
    nan = wide.isnan()
    assert torch.equal(rounded.isnan(), nan) and (rounded.view(torch.int16)[nan] == 0x7FC0).all()
    assert torch.equal(rounded[~nan].view(torch.int16), wide[~nan].bfloat16().view(torch.int16))


def test_cpu_float32_kernel_refuses_what_it_cannot_take(level):
    ext = cpu_kernels()
    with pytest.raises(RuntimeError, match="float32 only"):
        ext.linear_f32(torch.randn(1, 64).bfloat16(), torch.randn(8, 64).bfloat16())
    for k in (40, 0):  # K = 0 divided by zero (SIGFPE) in the split of W's rows
        with pytest.raises(RuntimeError, match="K must be a positive multiple of 16"):
            ext.linear_f32(torch.randn(1, k), torch.randn(8, k))
    with pytest.raises(RuntimeError, match="K must be a positive multiple of 32"):
        ext.linear_bf16(torch.randn(1, 0).bfloat16(), torch.randn(8, 0).bfloat16())
    with pytest.raises(RuntimeError, match="contiguous"):
        ext.linear_f32(torch.randn(1, 64), torch.randn(64, 8).T)


def test_linear_dispatch_agrees_with_torch_for_every_shape_and_dtype(monkeypatch):
    w, b = torch.randn(96, 64), torch.randn(96)
    for dtype in (torch.float32, torch.bfloat16):
        for n in (1, 8, 9, 24, 25, 40, 130, 200):  # past the kernel's rows (25 and 40 at avx512) torch's path
            x = torch.randn(n, 64).to(dtype)
            ref = torch.nn.functional.linear(x.float(), w, b)
            torch.testing.assert_close(linear(x, w.to(dtype), b.to(dtype)).float(), ref, atol=0.3, rtol=0.05)
    kernel_rows = []
    real = cpu_kernels()
    if real is not None:  # float32 rows up to FLOAT32_MAX_ROWS go through the float32 kernel, in one call
        class Counting:
            def linear_f32(self, x, w):
                kernel_rows.append(x.shape[0])
                return real.linear_f32(x, w)

        monkeypatch.setattr("triforce.kernels.linear.cpu_kernels", lambda: Counting())
    past = pieced_max_rows(torch.float32) + 1  # torch's product
    for n in (3, 24, 25, past):
        x = torch.randn(n, 64)
        torch.testing.assert_close(linear(x, w, b), torch.nn.functional.linear(x, w, b), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(logits_linear(x, w), x @ w.T, atol=1e-5, rtol=1e-5)
    assert kernel_rows == ([] if real is None else [3, 3, 24, 24, 25, 25])
    x, w = torch.randn(3, 40), torch.randn(96, 40)  # K not a multiple of 16: torch's product, exactly
    assert torch.equal(linear(x, w, b), torch.nn.functional.linear(x, w, b))
    for dtype in (torch.float32, torch.bfloat16):  # no rows, or K = 0: torch's empty product, or zeros
        assert linear(torch.randn(0, 64).to(dtype), torch.randn(96, 64).to(dtype)).shape == (0, 96)
        assert not linear(torch.randn(2, 0).to(dtype), torch.randn(96, 0).to(dtype)).any()
    assert kernel_rows == ([] if real is None else [3, 3, 24, 24, 25, 25])


def assert_float32_logits(n):
    x, w = torch.randn(n, 576).bfloat16(), torch.randn(4096 + 5, 576).bfloat16()  # a ragged last block
    got = logits_linear(x, w)
    want = x.float() @ w.float().T
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)  # bfloat16 rounding alone errs by ~0.1
    assert (got - want).abs().max() < (want.bfloat16().float() - want).abs().max() / 100


@pytest.mark.parametrize("n", [1, 7, 13, 40, 70, 140, 200])
def test_bf16_logits_keep_float32_precision(level, n):
    """The head's float32 sums are not rounded to bfloat16: through the kernel in one piece or several
    (40 rows at the avx512 level; 70 in one piece at avx2 and amx; 140 in two at avx2, past amx's rows;
    200 is past what it takes anywhere)."""
    assert_float32_logits(n)


@pytest.mark.parametrize("n", [1, 70])
def test_bf16_logits_keep_float32_precision_without_kernels(n, monkeypatch):
    monkeypatch.setattr("triforce.kernels.linear.kernel_takes", lambda *args: False)
    assert_float32_logits(n)


def test_gpu_logits_come_from_one_product_with_float32_out(monkeypatch):
    """On a GPU the head is one matrix product asked for float32 sums (`mm_widens`); no GPU here, so the
    call is checked on meta tensors for its shape and dtype, and a CPU keeps the paths tested above."""
    x, w = torch.randn(5, 64).bfloat16(), torch.randn(96, 64).bfloat16()
    assert not linear_module.mm_widens(x, w)
    if not linear_module._MM_TAKES_OUT_DTYPE:
        pytest.skip("torch < 2.8: no out_dtype for mm, the block-wise path runs on GPUs too")
    monkeypatch.setattr(linear_module, "mm_widens", lambda x, weight: True)
    got = logits_linear(x.to("meta"), w.to("meta"))
    assert got.shape == (5, 96) and got.dtype == torch.float32 and got.device.type == "meta"


@pytest.mark.parametrize("native", [True, False])
def test_bf16_prefill_computes_in_float32_where_the_cpu_lacks_bfloat16(native, monkeypatch):
    """Past the kernel's rows (prefill chunks; 200 rows: past 24, 96 at the avx2 level, 128 at amx), a CPU without
    AVX512-BF16 multiplies in float32 and rounds once; with it, torch's bfloat16 product runs. Attention too,
    where no attention kernel runs (it takes a prefill chunk in pieces where it does)."""

    import triforce.kernels.attention as attention_module

    monkeypatch.setattr(linear_module, "native_bf16", lambda: native)
    monkeypatch.setattr(attention_module, "native_bf16", lambda: native)
    monkeypatch.setattr(attention_module, "DENSE_MASK_ENTRIES", 0)  # the split pass, as for a prefill chunk
    monkeypatch.setattr(attention_module, "kernel_max_rows", lambda: 0)
    float32_inputs = []
    for module, name in ((linear_module, "_float32_linear"), (attention_module, "_split_attention")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, real=real: float32_inputs.append(a[0].dtype) or real(*a))
    x, w, b = torch.randn(200, 64).bfloat16(), torch.randn(1500, 64).bfloat16(), torch.randn(1500).bfloat16()
    want = (x.float() @ w.float().T).bfloat16() + b if not native else torch.nn.functional.linear(x, w, b)
    torch.testing.assert_close(linear(x, w, b), want, atol=0, rtol=0 if native else 2 ** -8)
    q = torch.randn(4, 70, 64).bfloat16()  # 140 rows per KV head: past the attention kernel too
    k, v = torch.randn(2, 90, 64).bfloat16(), torch.randn(2, 90, 64).bfloat16()
    out = attention(q, k, v, 0.125)
    assert out.dtype == torch.bfloat16
    # float32 math without native bfloat16: the linear's blocks and the attention's inputs
    assert float32_inputs == ([] if native else [torch.bfloat16]) + [torch.bfloat16 if native else torch.float32]
    torch.testing.assert_close(out.float(), reference_attention(q.float(), k.float(), v.float(), 0.125).float(),
                               atol=2e-2, rtol=2e-2)
