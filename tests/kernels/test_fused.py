"""The fused CPU bfloat16 element-wise kernels against the torch expressions they replace."""
import pytest
import torch
import torch.nn.functional as F

from triforce.kernels import fused
from triforce.kernels.cpu import cpu_kernels

BF16_ULP = 2 ** -7  # relative spacing of bfloat16 numbers


@pytest.mark.parametrize("n,width", [(5, 576), (40, 1001)])  # 1001: a tail past the 8-lane loops
def test_rms_norm(level, n, width):
    x, w = (3 * torch.randn(n, width)).bfloat16(), (1 + 0.1 * torch.randn(width)).bfloat16()
    x32 = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)
    want = w * x32.to(torch.bfloat16)
    got = cpu_kernels().rms_norm_bf16(x, w, 1e-5)
    torch.testing.assert_close(got.float(), want.float(), rtol=BF16_ULP, atol=1e-6)
    assert (got == want).float().mean() > 0.99  # the same rounding steps: nearly all bit-identical


@pytest.mark.parametrize("n,width", [(3, 1536), (7, 1536), (2, 1000)])  # 1000: a tail past the 8- and 16-lane loops
def test_silu_mul(level, n, width):
    gate_up = (4 * torch.randn(n, 2 * width)).bfloat16()
    gate_up[0, :8] = torch.tensor([-200.0, -90.0, -20.0, 0.0, 20.0, 90.0, 200.0, 1e-30])  # e^-g over/underflow
    gate, up = gate_up.chunk(2, dim=-1)
    want, got = F.silu(gate) * up, cpu_kernels().silu_mul_bf16(gate_up)
    torch.testing.assert_close(got.float(), want.float(), rtol=BF16_ULP, atol=1e-6)
    assert (got == want).float().mean() > 0.99


def test_silu_mul_where_e_to_the_minus_gate_overflows(level):
    """Gates past -ln(FLT_MAX) make e^-g infinite, so silu is -0 as torch computes it (the AVX2 exp once
    stopped at e^88, a tiny non-zero), -inf gives NaN, and NaN stays NaN: bit for bit, 8 and 16 lanes."""
    edges = [-float("inf"), -200.0, -90.0, -89.0, -88.75, -88.5, -88.0, -87.5, -87.0, 88.5, 90.0,
             float("inf"), float("nan"), -1.0, 0.0, 1.0]
    gate = torch.tensor(edges * 2).bfloat16().view(1, -1)
    up = (1 + torch.rand_like(gate.float())).bfloat16()
    want, got = F.silu(gate) * up, cpu_kernels().silu_mul_bf16(torch.cat([gate, up], dim=-1))
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num().view(torch.int16), want.nan_to_num().view(torch.int16))  # -0 apart from 0


@pytest.mark.parametrize("n,head_dim", [(1, 64), (7, 64), (300, 128), (5, 36)])  # 36: not 8 lanes a half
def test_rope_on_a_strided_view(level, n, head_dim):
    qkv = torch.randn(n, 15 * head_dim).bfloat16()
    x = qkv[:, : 9 * head_dim].view(n, 9, head_dim).transpose(0, 1)  # [H, n, D] as the model hands it over
    cos, sin = torch.randn(n, head_dim).bfloat16(), torch.randn(n, head_dim).bfloat16()
    half = head_dim // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    assert torch.equal(cpu_kernels().rope_bf16(x, cos, sin), x * cos + rotated * sin)
    assert torch.equal(fused.rope(x, cos, sin), x * cos + rotated * sin)


def test_inputs_the_kernels_do_not_take_go_to_torch(level):
    """A float32 norm weight beside bfloat16 activations, broadcast or float32 rotation tables, a 3-D
    input to a linear layer: torch's expressions take them (the kernels raised on them)."""
    from triforce.kernels.linear import linear

    x, w32 = torch.randn(5, 576).bfloat16(), 1 + 0.1 * torch.randn(576)
    x32 = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)
    assert torch.equal(fused.rms_norm(x, w32, 1e-5), w32 * x32.to(torch.bfloat16))
    q = torch.randn(4, 6, 64).bfloat16()
    rotated = torch.cat((-q[..., 32:], q[..., :32]), dim=-1)
    for cos, sin in ((torch.randn(1, 64).bfloat16(), torch.randn(1, 64).bfloat16()),  # one position for all
                     (torch.randn(6, 64), torch.randn(6, 64))):  # float32 tables
        assert torch.equal(fused.rope(q, cos, sin), q * cos + rotated * sin)
    x3, weight = torch.randn(2, 3, 64).bfloat16(), torch.randn(96, 64).bfloat16()
    assert torch.equal(linear(x3, weight), F.linear(x3, weight))
