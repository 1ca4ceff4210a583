"""The CPU kernels (csrc/*.cpp) as one torch extension, built on first use.

They need AVX512-BF16 (Intel Cooper Lake / Sapphire Rapids and later, AMD Zen 4 and later) and a C++
compiler (GCC 11+ or Clang 12+, for the AMX intrinsics; AMX itself is used only where the CPU has it); torch compiles them once (about a minute) and caches the result in ~/.cache/torch_extensions.
Where that is impossible, or TRIFORCE_CPU_KERNELS=0, `cpu_kernels()` returns None and callers use torch.
"""
from __future__ import annotations

import functools
import logging
import os
import sys
from pathlib import Path

log = logging.getLogger(__name__)
NAME = "triforce_cpu_kernels"
SOURCES = ("amx.cpp", "linear_bf16.cpp", "linear_amx.cpp", "attention_bf16.cpp", "attention_amx.cpp", "fused_bf16.cpp",
           "decoder_bf16.cpp", "bindings.cpp")
_extension = None
_tried = False


def _cpu_has_avx512_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags and "avx512bw" in flags


def cpu_kernels():
    """The compiled extension, or None where it cannot be had."""
    global _extension, _tried
    if _tried:
        return _extension
    _tried = True
    if os.environ.get("TRIFORCE_CPU_KERNELS", "1") == "0" or not _cpu_has_avx512_bf16():
        return None
    try:
        from torch.utils import cpp_extension

        build_dir = Path(cpp_extension._get_build_directory(NAME, verbose=False))
        if not (build_dir / f"{NAME}.so").exists():
            print("triforce: compiling the CPU bfloat16 kernels (about a minute, once)", file=sys.stderr)
        csrc = Path(__file__).parent / "csrc"
        _extension = cpp_extension.load(
            name=NAME, sources=[str(csrc / s) for s in SOURCES],
            extra_cflags=["-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16",
                         "-mamx-tile", "-mamx-bf16"],
            extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as exc:  # no compiler, no ninja, an old toolchain: fall back to torch
        log.warning("CPU bf16 kernels unavailable, using torch: %s", str(exc).splitlines()[0] if str(exc) else exc)
        _extension = None
    return _extension


@functools.cache
def has_amx() -> bool:
    """The extension is here and may use AMX tiles (the tile paths of the attention and linear kernels)."""
    ext = cpu_kernels()
    return ext is not None and ext.amx_usable()
