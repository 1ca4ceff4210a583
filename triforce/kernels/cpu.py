"""The CPU kernels (csrc/), built on first use for the instruction-set level this process runs at.

Levels, lowest first (what each needs from the CPU):
- `avx2`   AVX2 + FMA (every x86-64 CPU of the last decade): bfloat16 weights and KV cache widened to
           float32 in registers, float32 FMA (csrc/*_avx2.cpp); half the bytes of float32 per decode step.
           Every level also has this float32 linear kernel for float32 weights (csrc/linear_f32.cpp).
- `avx512` AVX512-BF16 with AVX512-BW/VL (Intel Cooper Lake and later, AMD Zen 4 and later): the vector
           kernels, compiled without AMX flags, so a toolchain without AMX support still builds them.
- `amx`    AMX-BF16 tiles as well (Intel Sapphire Rapids and later): the tile paths on top.

The level is the CPU's best, or lower with TRIFORCE_CPU_ISA=avx2|avx512|amx (a level the CPU lacks is
refused), or none with TRIFORCE_CPU_KERNELS=0. Each level is its own extension
(triforce_cpu_<level>_<digest>, build.py's `build_name`: a digest of the sources and where they are, the level's
flags, torch, Python's extension suffix and the compiler), compiled once by torch (20-25 s on the 2-core Xeon) and cached
in ~/.cache/torch_extensions. A build that
fails on a CPU that should have the kernels logs one warning saying so and what runs instead (the next
level down, or torch's paths).
"""
from __future__ import annotations

import functools
import logging
import os
import platform
from pathlib import Path

from ..errors import UserError
from .build import NoCompiler, build, build_failure

log = logging.getLogger(__name__)
# where the kernels cannot load: a check's rows then sum otherwise than a one-token step's (docs/status.md)
TORCH_PATHS = ("torch's slower paths, whose checks round otherwise than single steps (greedy output may part "
               "from ar's at a near-tie)")
LEVELS = ("avx2", "avx512", "amx")  # lowest first
_FLAGS_OF_LEVEL = {"avx2": ("avx2", "fma"), "avx512": ("avx512_bf16", "avx512bw", "avx512vl"),
                   "amx": ("amx_bf16", "amx_tile")}


class IsaError(UserError):
    """TRIFORCE_CPU_ISA names a level this CPU lacks, or no level at all."""


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


@functools.cache
def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what `platform` says."""
    try:
        return next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


@functools.cache
def cpu_isa() -> str | None:
    """The highest level this CPU has (None: not even AVX2 + FMA, or not x86-64 Linux)."""
    flags, best = _cpu_flags(), None
    for level in LEVELS:
        if not set(_FLAGS_OF_LEVEL[level]) <= flags:
            break
        best = level
    return best


@functools.cache
def isa_level() -> str | None:
    """The level this process runs its kernels at: the CPU's, or lower with TRIFORCE_CPU_ISA."""
    wanted, best = os.environ.get("TRIFORCE_CPU_ISA", "").strip().lower(), cpu_isa()
    if not wanted:
        return best
    if wanted not in LEVELS:
        raise IsaError(f"TRIFORCE_CPU_ISA must be one of {', '.join(LEVELS)} (got {wanted!r})")
    if best is None or LEVELS.index(wanted) > LEVELS.index(best):
        raise IsaError(f"TRIFORCE_CPU_ISA={wanted}, but this CPU's best level is {best or 'below avx2'}")
    return wanted


def available_levels() -> list[str]:
    """The levels this CPU can run, lowest first (tests run each level's kernels against the reference)."""
    best = cpu_isa()
    return [] if best is None else list(LEVELS[: LEVELS.index(best) + 1])


_FAILED: dict[str, str] = {}  # per level: why its build failed in this process (not tried again)


@functools.cache
def extension(level: str):
    """The kernels of one level, compiled on first use (raises where they cannot be built: once per process;
    every kernel test asked again, and without a toolchain each asking ran a failing build)."""
    if level in _FAILED:  # (a new exception each time: re-raising one would grow its traceback)
        raise RuntimeError(_FAILED[level])
    try:
        return build(level)
    except Exception as exc:
        _FAILED[level] = str(exc)
        raise


def native_bf16() -> bool:
    """Whether this CPU (at the level this process runs at) computes bfloat16 natively. Where it does not,
    torch's bfloat16 matrix products and attention run far slower than float32, so prefill computes in
    float32 over bfloat16 storage (and --dtype auto picks float32 unless the AVX2 kernels built)."""
    return isa_level() in ("avx512", "amx")


@functools.cache
def loaded_kernels() -> tuple[str | None, object | None]:
    """(the level whose kernels are loaded, the extension); (None, None) where torch's paths run."""
    if not kernels_wanted():
        return None, None
    level = isa_level()
    candidates = list(LEVELS[: LEVELS.index(level) + 1])[::-1] if level else []
    for candidate in candidates:
        try:
            return candidate, extension(candidate)
        except Exception as exc:  # no compiler, no ninja, a toolchain without these instructions
            reason = build_failure(exc)
            last = candidate == candidates[-1] or isinstance(exc, NoCompiler)  # (no level builds without one)
            log.warning("the CPU has %s but its kernels failed to build (%s); using %s", candidate, reason,
                        TORCH_PATHS if last else "the next level down")
            if last:
                return None, None
    return None, None


def kernels_wanted() -> bool:
    """TRIFORCE_CPU_KERNELS: 0, false, off or no turns the kernels off (only "0" did; "false" left them on)."""
    value = os.environ.get("TRIFORCE_CPU_KERNELS", "1").strip().lower()
    if value in ("0", "false", "off", "no"):
        return False
    if value in ("1", "true", "on", "yes", ""):
        return True
    raise IsaError(f"TRIFORCE_CPU_KERNELS must be 1 or 0 (on or off; got {value!r})")


def cpu_kernels():
    """The compiled extension, or None where it cannot be had."""
    return loaded_kernels()[1]


def kernel_path() -> str:
    """What runs the CPU's bfloat16 decode work: 'amx', 'avx512', 'avx2' (our kernels) or 'torch'. An amx
    build whose tiles the OS refused this process (a sandbox) runs the avx512 paths, and says so: the
    calibration keys costs by it, and reports name it."""
    level = loaded_kernels()[0]
    if level == "amx" and not has_amx():
        return "avx512"
    return level or "torch"


@functools.cache
def has_amx() -> bool:
    """The extension is here and may use AMX tiles (the tile paths of the attention and linear kernels)."""
    ext = cpu_kernels()
    return ext is not None and ext.amx_usable()
