import pytest
import torch

from triforce.kernels.cpu import cpu_kernels
from triforce.kernels.linear import linear, reference_linear

needs_kernel = pytest.mark.skipif(cpu_kernels() is None, reason="no AVX512-BF16 CPU or no C++ toolchain")


@needs_kernel
@pytest.mark.parametrize("n", [1, 2, 5, 8])
@pytest.mark.parametrize("k,out", [(576, 1728), (1536, 576), (64, 3)])
def test_cpu_bf16_kernel_matches_float32_reference(n, k, out):
    x, w = torch.randn(n, k).bfloat16(), torch.randn(out, k).bfloat16()
    got, want = cpu_kernels().linear_bf16(x, w).float(), reference_linear(x, w).float()
    # Both accumulate in float32 (in different orders) and round once to bfloat16: one bf16 ulp apart at most.
    torch.testing.assert_close(got, want, atol=1e-6, rtol=2 ** -7)


def test_linear_dispatch_agrees_with_torch_for_every_shape_and_dtype():
    w, b = torch.randn(96, 64), torch.randn(96)
    for dtype in (torch.float32, torch.bfloat16):
        for n in (1, 8, 9, 40):  # 9 and 40 rows take torch's path even in bfloat16
            x = torch.randn(n, 64).to(dtype)
            ref = torch.nn.functional.linear(x.float(), w, b)
            torch.testing.assert_close(linear(x, w.to(dtype), b.to(dtype)).float(), ref, atol=0.3, rtol=0.05)
    x = torch.randn(3, 64)
    assert torch.equal(linear(x, w, b), torch.nn.functional.linear(x, w, b))  # float32 is torch's, exactly
