"""Linear layers for decoding: a CPU bfloat16 kernel for a few rows, torch everywhere else.

`linear(x, weight, bias)` is F.linear, except on a CPU with AVX512-BF16 for bfloat16 inputs of at most
8 rows (decode steps and speculative checks), where torch's own bf16 matrix-vector path reads weights
at well under the memory bandwidth. The kernel is csrc/linear_bf16.cpp (built by cpu.py); without it,
torch's path is used. `reference_linear` is what the tests compare it with.

`logits_linear` is the output head: float32 logits. The kernel hands over its float32 sums unrounded:
rounded to bfloat16 (8 bits of mantissa, a step of 0.125 at a logit of 20), near-equal candidates tie,
and greedy decoding then depends on how many tokens a forward happened to carry.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .cpu import cpu_kernels

MAX_ROWS = 8
MAX_LOGIT_ROWS = 64  # logits of up to this many rows go through the kernel in pieces of MAX_ROWS


def _kernel_for(x: torch.Tensor, weight: torch.Tensor, max_rows: int):
    if (x.dtype == torch.bfloat16 and not x.is_cuda and x.shape[0] <= max_rows and x.shape[1] % 32 == 0
            and weight.is_contiguous()):
        return cpu_kernels()
    return None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x: [n, K] -> [n, N]."""
    ext = _kernel_for(x, weight, MAX_ROWS)
    if ext is not None:
        out = ext.linear_bf16(x, weight)
        return out if bias is None else out + bias
    return F.linear(x, weight, bias)


def logits_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x: [n, K] -> float32 [n, N]."""
    ext = _kernel_for(x, weight, MAX_LOGIT_ROWS)
    if ext is None:
        return F.linear(x, weight).float()
    return torch.cat([ext.linear_bf16(piece, weight, float_out=True) for piece in x.split(MAX_ROWS)])


def reference_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """float32 accumulation, rounded once to x's dtype."""
    return (x.float() @ weight.float().T).to(x.dtype)
