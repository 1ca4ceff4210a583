"""The int8 linear kernel (csrc/linear_i8.cpp) and the quantization it reads (kernels/int8.py)."""
import pytest
import torch

from triforce.kernels import int8 as int8_module
from triforce.kernels.cpu import cpu_kernels
from triforce.kernels.int8 import Int8Weight, int8_linear, reference_int8_linear


def test_int8_weights_round_each_row_to_its_own_scale():
    w = torch.randn(40, 64) * torch.logspace(-3, 2, 40)[:, None]  # rows of very different sizes
    w[7] = 0  # a row of zeros quantizes to zeros, with a normal scale
    q = Int8Weight.of(w.bfloat16())
    assert q.q.dtype == torch.int8 and q.scale.dtype == torch.float32 and q.q.abs().max() <= 127
    assert (q.scale >= torch.finfo(torch.float32).tiny).all() and not q.q[7].any()
    assert (q.q.abs().amax(1)[torch.arange(40) != 7] == 127).all()  # each row's largest weight spans the range
    err = (q.dequantized(torch.float32) - w.bfloat16().float()).abs()
    assert (err <= q.scale[:, None] / 2 * 1.0001).all()  # round to nearest: half a step at most


def test_quantizing_in_blocks_equals_quantizing_whole(monkeypatch):
    w = torch.randn(50, 32).bfloat16()
    whole = Int8Weight.of(w)
    monkeypatch.setattr(int8_module, "QUANTIZE_BLOCK_ROWS", 16)  # 50 rows: blocks of 16, the last of 2
    blocks = Int8Weight.of(w)
    assert torch.equal(whole.q, blocks.q) and torch.equal(whole.scale, blocks.scale)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n", [1, 2, 5, 7, 8, 9, 11, 16, 40])
@pytest.mark.parametrize("k,out", [(576, 1728), (1536, 576), (64, 3), (48, 80)])
def test_cpu_int8_kernel_matches_the_reference(level, dtype, n, k, out):
    """At every level; bfloat16 rows with K a multiple of 32 take bfloat16 dot products at the avx512 and
    amx levels, everything else float32 FMA (K = 48: the float32 path at every level); 16 and 40 rows take
    several passes of 8 over each tile of W (9 too on the float32 path; the bfloat16 one takes up to 11 in
    one pass), 1728 rows of W at K = 576 several tiles."""
    x = torch.randn(n, k).to(dtype)
    w = Int8Weight.of(torch.randn(out, k) * torch.rand(out, 1))
    got = int8_linear(x, w)
    assert got.dtype == dtype and got.shape == (n, out)
    want = reference_int8_linear(x, w)
    if dtype == torch.bfloat16:  # both sum in float32 (in other orders), scale and round once: an ulp apart
        torch.testing.assert_close(got.float(), want.float(), atol=1e-4, rtol=2 ** -7)
    else:
        exact = (x.double() @ w.q.double().T) * w.scale.double()
        torch.testing.assert_close(got.double(), exact, atol=1e-5 * k ** 0.5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("out", [300, 320])  # (320: a multiple of 16, AMX tiles at the amx level)
def test_cpu_int8_kernel_rows_do_not_depend_on_how_many_share_a_call(level, dtype, out):
    """A row sums in one order whatever rows share its call, so a proposing tier with int8 weights gives a
    request the same proposals alone as in a batch (its seeded samples then follow one path either way)."""
    x, w = torch.randn(24, 576).to(dtype), Int8Weight.of(torch.randn(out, 576))
    alone = torch.cat([cpu_kernels().linear_i8(row[None], w.q, w.scale) for row in x])
    for n in range(2, 25):
        assert torch.equal(cpu_kernels().linear_i8(x[:n], w.q, w.scale), alone[:n]), n


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cpu_int8_kernel_hands_logits_over_as_float32_sums(level, dtype):
    """float_out (an int8 output head's logits): the scaled float32 sums, unrounded, as the reference's."""
    x, w = torch.randn(3, 576).to(dtype), Int8Weight.of(torch.randn(700, 576))
    got = int8_linear(x, w, float_out=True)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, reference_int8_linear(x, w, float_out=True), atol=1e-4, rtol=1e-5)
    assert not torch.equal(got, got.bfloat16().float())  # not rounded to bfloat16 on the way


def test_cpu_int8_kernel_checks_its_arguments(level):
    x, w = torch.randn(2, 64).bfloat16(), Int8Weight.of(torch.randn(8, 64))
    ext = cpu_kernels()
    with pytest.raises(RuntimeError, match="multiple of 16"):
        ext.linear_i8(torch.randn(2, 40).bfloat16(), w.q[:, :40].contiguous(), w.scale)
    with pytest.raises(RuntimeError, match="scale"):
        ext.linear_i8(x, w.q, w.scale[:4])
    with pytest.raises(RuntimeError, match="int8 weights"):
        ext.linear_i8(x, w.q.float(), w.scale)


def test_without_the_kernel_int8_weights_take_the_reference(monkeypatch):
    monkeypatch.setattr(int8_module, "cpu_kernels", lambda: None)
    x, w = torch.randn(3, 64).bfloat16(), Int8Weight.of(torch.randn(8, 64))
    assert not int8_module.kernel_takes(x, w)
    assert torch.equal(int8_linear(x, w), reference_int8_linear(x, w))
