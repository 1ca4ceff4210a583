"""Linear layers for decoding: a CPU bfloat16 kernel for a few rows, torch everywhere else.

`linear(x, weight, bias)` is F.linear, except on a CPU with AVX512-BF16 for bfloat16 inputs of at most
8 rows (decode steps and speculative checks), where torch's own bf16 matrix-vector path reads weights
at well under the memory bandwidth. The kernel (csrc/linear_bf16.cpp) is compiled with the system C++
compiler on first use and cached by torch (~/.cache/torch_extensions); if that fails, or
TRIFORCE_CPU_KERNELS=0, torch's path is used. `reference_linear` is what the tests compare it with.
"""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)
MAX_ROWS = 8
_extension = None
_tried = False


def _cpu_has_avx512_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags and "avx512bw" in flags


def cpu_kernel():
    """The compiled extension, or None where it cannot be had."""
    global _extension, _tried
    if _tried:
        return _extension
    _tried = True
    if os.environ.get("TRIFORCE_CPU_KERNELS", "1") == "0" or not _cpu_has_avx512_bf16():
        return None
    try:
        from torch.utils import cpp_extension

        build_dir = Path(cpp_extension._get_build_directory("triforce_linear_bf16", verbose=False))
        if not (build_dir / "triforce_linear_bf16.so").exists():
            print("triforce: compiling the CPU bfloat16 linear kernel (under a minute, once)", file=sys.stderr)
        _extension = cpp_extension.load(name="triforce_linear_bf16", sources=[str(Path(__file__).parent / "csrc" / "linear_bf16.cpp")],
                          extra_cflags=["-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16"],
                          extra_ldflags=["-fopenmp"],
                          verbose=False)
    except Exception as exc:  # no compiler, no ninja, an old toolchain: fall back to torch
        log.warning("CPU bf16 kernel unavailable, using torch: %s", str(exc).splitlines()[0] if str(exc) else exc)
        _extension = None
    return _extension


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x: [n, K] -> [n, N]."""
    if (x.dtype == torch.bfloat16 and not x.is_cuda and x.shape[0] <= MAX_ROWS and x.shape[1] % 32 == 0
            and weight.is_contiguous()):
        ext = cpu_kernel()
        if ext is not None:
            out = ext.linear_bf16(x, weight)
            return out if bias is None else out + bias
    return F.linear(x, weight, bias)


def reference_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """float32 accumulation, rounded once to x's dtype."""
    return (x.float() @ weight.float().T).to(x.dtype)
