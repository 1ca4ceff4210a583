"""Linear layers for decoding: a CPU bfloat16 kernel for a few rows, torch everywhere else.

`linear(x, weight, bias)` is F.linear, except on a CPU with AVX512-BF16 for bfloat16 inputs of at most
8 rows (decode steps and speculative checks), where torch's own bf16 matrix-vector path reads weights
at well under the memory bandwidth. The kernel is csrc/linear_bf16.cpp (built by cpu.py); without it,
torch's path is used. `reference_linear` is what the tests compare it with.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .cpu import cpu_kernels

MAX_ROWS = 8


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x: [n, K] -> [n, N]."""
    if (x.dtype == torch.bfloat16 and not x.is_cuda and x.shape[0] <= MAX_ROWS and x.shape[1] % 32 == 0
            and weight.is_contiguous()):
        ext = cpu_kernels()
        if ext is not None:
            out = ext.linear_bf16(x, weight)
            return out if bias is None else out + bias
    return F.linear(x, weight, bias)


def reference_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """float32 accumulation, rounded once to x's dtype."""
    return (x.float() @ weight.float().T).to(x.dtype)
