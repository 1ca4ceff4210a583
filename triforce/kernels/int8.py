"""int8 weights with one float32 scale per output row, and their product (csrc/linear_i8.cpp).

A proposing tier (the retrieval tier, the draft) may read an approximation of its weights: the target
checks every token it proposes with its own, so the output is the target's either way (speculative
sampling is exact for any proposer), and only how often the proposals are accepted changes. A decode step
reads every weight once, so int8 weights halve what such a tier's forward reads (models/quantized.py builds
the copy).
`reference_int8_linear` is what the tests compare the kernel with.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .cpu import cpu_kernels

QUANTIZE_BLOCK_ROWS = 1024  # rows quantized at a time (a float32 copy of the block, not of the matrix)
K_STEP = 16  # the kernel's K must be a multiple of this (32 for its bfloat16 dot products; else float32 FMA)


@dataclass(frozen=True, eq=False)  # (no __eq__ over tensors)
class Int8Weight:
    """Symmetric per-row quantization: weight[i] ~ q[i] * scale[i], q in [-127, 127]."""
    q: torch.Tensor  # int8 [N, K]
    scale: torch.Tensor  # float32 [N]

    @classmethod
    def of(cls, weight: torch.Tensor) -> "Int8Weight":
        q = torch.empty(weight.shape, dtype=torch.int8, device=weight.device)
        scale = torch.empty(weight.shape[0], dtype=torch.float32, device=weight.device)
        for start in range(0, weight.shape[0], QUANTIZE_BLOCK_ROWS):
            block = weight[start:start + QUANTIZE_BLOCK_ROWS].float()
            largest = block.abs().amax(1)
            s = torch.where(largest > 0, largest / 127, 1.0)  # (a row of zeros: any scale; 1, not a subnormal)
            q[start:start + block.shape[0]] = torch.round(block / s[:, None]).clamp_(-127, 127).to(torch.int8)
            scale[start:start + block.shape[0]] = s
        return cls(q, scale)

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.scale.nbytes

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        return (self.q.float() * self.scale[:, None]).to(dtype)


def weight_fits(weight: Int8Weight) -> bool:
    """Whether the CPU kernel takes this weight (its K a multiple of 16, on the CPU, contiguous)."""
    k = weight.shape[1]
    return weight.q.device.type == "cpu" and weight.q.is_contiguous() and k > 0 and k % K_STEP == 0


def kernel_takes(x: torch.Tensor, weight: Int8Weight) -> bool:
    """Whether `int8_linear` runs x [n, K] times this weight on the CPU kernel (any count of rows)."""
    return (cpu_kernels() is not None and x.device.type == "cpu" and x.dim() == 2 and x.shape[0] >= 1
            and x.dtype in (torch.bfloat16, torch.float32) and weight_fits(weight))


def int8_linear(x: torch.Tensor, weight: Int8Weight, bias: torch.Tensor | None = None,
                float_out: bool = False) -> torch.Tensor:
    """x: [..., K] -> [..., N] in x's dtype (float_out: float32, unrounded, as logits are)."""
    if kernel_takes(x, weight):
        out = cpu_kernels().linear_i8(x, weight.q, weight.scale, float_out)
    else:
        out = reference_int8_linear(x, weight, float_out)
    return out if bias is None else out + bias


def reference_int8_linear(x: torch.Tensor, weight: Int8Weight, float_out: bool = False) -> torch.Tensor:
    """float32 sums scaled per row, rounded once to x's dtype (float_out: kept float32)."""
    out = (x.float() @ weight.q.float().T) * weight.scale
    return out if float_out else out.to(x.dtype)
