"""Element-wise steps of a decoder layer: fused CPU bfloat16 kernels (csrc/fused_bf16.cpp, rounding as
the torch expressions below do) where available, these torch expressions everywhere else."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .cpu import cpu_kernels


def _kernel_for(x: torch.Tensor):
    return cpu_kernels() if x.dtype == torch.bfloat16 and x.device.type == "cpu" else None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [n, H]. float32 statistics, as transformers does, so bf16 models agree with it."""
    ext = _kernel_for(x)
    if ext is not None and x.dim() == 2 and weight.dtype == x.dtype:
        return ext.rms_norm_bf16(x, weight, eps)
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[n, 2I] = [gate | up] -> silu(gate) * up, [n, I]."""
    ext = _kernel_for(gate_up)
    if ext is not None and gate_up.dim() == 2:
        return ext.silu_mul_bf16(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [H, n, D] rotated by the (cos, sin) [n, D] of its n positions."""
    ext = _kernel_for(x)
    if (ext is not None and x.dim() == 3 and x.stride(-1) == 1 and cos.shape == sin.shape == x.shape[1:]
            and cos.dtype == sin.dtype == x.dtype):
        return ext.rope_bf16(x, cos, sin)
    half = x.shape[-1] // 2
    rotated_half = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated_half * sin
