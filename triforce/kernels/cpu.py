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
(triforce_cpu_<level>_<digest>, `build_name`: a digest of the sources, the level's flags, torch, Python's
extension suffix and the compiler), compiled once by torch (20-25 s on the 2-core Xeon) and cached in
~/.cache/torch_extensions. A build that
fails on a CPU that should have the kernels logs one warning saying so and what runs instead (the next
level down, or torch's paths).
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: a killed build's lock is waited out (_clear_stale_lock)
    fcntl = None

from ..errors import UserError

log = logging.getLogger(__name__)
STALE_LOCK_S = 600.0  # a kernel build's lock file older than this was left by a build that was killed
KILLED_BUILD_S = 60.0  # ...where no triforce process is building (_building): a build takes under a minute
LEVELS = ("avx2", "avx512", "amx")  # lowest first
CSRC = Path(__file__).parent / "csrc"
_PATH_LOCK = threading.Lock()  # _our_ninja_first
_VECTOR_SOURCES = ("linear_bf16.cpp", "linear_f32.cpp", "attention_bf16.cpp", "attention_f32.cpp", "fused_bf16.cpp",
                   "decoder_bf16.cpp", "bindings.cpp")
_AVX512_FLAGS = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mfma", "-mavx2"]
BUILDS = {  # level -> (sources, compiler flags)
    "avx2": (("linear_avx2.cpp", "linear_f32.cpp", "attention_avx2.cpp", "attention_f32.cpp", "fused_bf16.cpp",
              "decoder_bf16.cpp", "bindings.cpp"),
             ["-mavx2", "-mfma", "-DTRIFORCE_WITH_AMX=0"]),
    "avx512": (_VECTOR_SOURCES, _AVX512_FLAGS + ["-DTRIFORCE_WITH_AMX=0"]),
    "amx": (_VECTOR_SOURCES + ("amx.cpp", "linear_amx.cpp", "attention_amx.cpp"),
            _AVX512_FLAGS + ["-mamx-tile", "-mamx-bf16", "-DTRIFORCE_WITH_AMX=1"]),
}
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
        return _build(level)
    except Exception as exc:
        _FAILED[level] = str(exc)
        raise


def native_bf16() -> bool:
    """Whether this CPU (at the level this process runs at) computes bfloat16 natively. Where it does not,
    torch's bfloat16 matrix products and attention run far slower than float32, so prefill computes in
    float32 over bfloat16 storage (and --dtype auto picks float32 unless the AVX2 kernels built)."""
    return isa_level() in ("avx512", "amx")


def _build(level: str):
    from torch.utils import cpp_extension

    name = build_name(level)
    sources, flags = BUILDS[level]
    build_dir = Path(cpp_extension._get_build_directory(name, verbose=False))
    with _building(build_dir):
        if not (build_dir / f"{name}.so").exists():
            print(f"triforce: compiling the CPU kernels for {level} (half a minute or so, once)", file=sys.stderr)
        with _our_ninja_first():
            return cpp_extension.load(name=name, sources=[str(CSRC / s) for s in sources],
                                      extra_cflags=["-O3", "-fopenmp", *flags], extra_ldflags=["-fopenmp"],
                                      verbose=False)


def build_name(level: str) -> str:
    """The extension's name, and its build folder's: the level and a digest of what makes the build
    (`_build_digest`). Named by the level alone, one folder served every version: ninja rebuilds on a
    changed source's time or command line, but not on a new torch in the same environment (its headers are
    system includes, left out of ninja's dependencies): the old library, built against the other torch,
    then failed to load (or worse, loaded) and every level fell back to torch's paths until the folder was
    deleted; two checkouts also rebuilt each other's kernels in turn (a minute each)."""
    return f"triforce_cpu_{level}_{_build_digest(level)}"


def _build_digest(level: str) -> str:
    """The sources, the level's flags, torch's and Python's versions and the compiler, digested."""
    import torch

    return hashlib.sha256("\0".join([kernel_sources_digest(), str(BUILDS[level]), torch.__version__,
                                      sysconfig.get_config_var("EXT_SUFFIX") or "", _compiler()]).encode()
                          ).hexdigest()[:8]


def _compiler() -> str:
    """The C++ compiler torch builds with (CXX, else c++): its real file and version (named through a link or
    another locale, it is the same), '' where there is none (the build says so; not kept, found later)."""
    if "compiler" in _COMPILER:
        return _COMPILER["compiler"]
    found = shutil.which(os.environ.get("CXX", "c++"))
    if found is None:
        return ""
    try:  # gcc's whole version (-dumpversion says 12 for 12.2.0), else what clang says to -dumpversion
        version = next(filter(None, (subprocess.run([found, flag], capture_output=True, text=True, timeout=30,
                                                    env={**os.environ, "LC_ALL": "C"}).stdout.strip()
                                     for flag in ("-dumpfullversion", "-dumpversion"))), "")
    except (OSError, subprocess.SubprocessError):
        return ""
    _COMPILER["compiler"] = f"{os.path.realpath(found)} {version}"
    return _COMPILER["compiler"]


_COMPILER: dict[str, str] = {}


@contextlib.contextmanager
def _building(build_dir: Path):
    """The build of `build_dir` by this process alone: a lock beside it (the system releases it with its
    process, however that ends) taken in turn by triforce processes. Holding it, torch's own lock file there
    (it carries no owner and nothing renews it) older than KILLED_BUILD_S is a killed build's: removed, where
    the next run waited STALE_LOCK_S for it (ten minutes after a Ctrl-C mid-build). A younger one may be a
    builder that takes no such lock (an older triforce; a compiler its killed parent left running): waited
    for up to then. Where the file system refuses the lock (NFS or Lustre without flock, another user's
    file), the STALE_LOCK_S wait."""
    lock = build_dir / "lock"
    fd = None
    if fcntl is not None:
        try:
            fd = os.open(build_dir.parent / f"{build_dir.name}.building", os.O_RDONLY | os.O_CREAT, 0o666)
            fcntl.flock(fd, fcntl.LOCK_EX)  # another process's build in progress: wait for it to end
        except OSError as exc:
            log.warning("cannot lock the kernel build in %s (%s): going on without", build_dir, exc)
            if fd is not None:
                os.close(fd)
            fd = None
    try:
        _clear_stale_lock(lock, KILLED_BUILD_S if fd is not None else STALE_LOCK_S)
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock


@contextlib.contextmanager
def _our_ninja_first():
    """torch runs whichever `ninja` is first on PATH. The one our install brings (the `ninja` package, a
    dependency) sits in the environment's bin folder, which is not on PATH where that environment is not
    activated (`make run` calls .venv/bin/triforce): without a system ninja the build then failed ("pip
    install ninja to get it", though it was installed), and with one, runs that alternated between the
    two rebuilt the kernels each time (their build logs differ: 40-60 s each on the 2-core EPYC, in the
    middle of the test suite). So the build runs with that folder first on PATH (the whole folder: the
    environment's python and pip come first too, for the build's half a minute), then PATH as it was."""
    try:
        import ninja
        folder = ninja.BIN_DIR
    except (ImportError, AttributeError):
        folder = None
    if not folder:  # None, or "" where ninja could not find its binary: "" on PATH is the working directory
        yield
        return
    with _PATH_LOCK:  # two threads' builds would otherwise restore each other's PATH
        path = os.environ.get("PATH")
        os.environ["PATH"] = folder + os.pathsep + path if path else folder
        try:
            yield
        finally:
            if path is None:
                del os.environ["PATH"]
            else:
                os.environ["PATH"] = path


def _clear_stale_lock(lock: Path, stale_s: float = STALE_LOCK_S, poll_s: float = 2.0) -> None:
    """torch's builder waits, without end, for the lock file of the build in progress to go; a build killed
    midway leaves it behind, and every later process would hang. Waits for another process's build up to
    `stale_s` after the lock was made (a build takes under a minute), then removes the lock, saying so."""
    while True:
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            return
        if age > stale_s:
            log.warning("removing %s, left %.0f s ago by a kernel build that never finished", lock, age)
            lock.unlink(missing_ok=True)
            return
        time.sleep(poll_s)


@functools.cache
def loaded_kernels() -> tuple[str | None, object | None]:
    """(the level whose kernels are loaded, the extension); (None, None) where torch's paths run."""
    if os.environ.get("TRIFORCE_CPU_KERNELS", "1") == "0":
        return None, None
    level = isa_level()
    candidates = list(LEVELS[: LEVELS.index(level) + 1])[::-1] if level else []
    for candidate in candidates:
        try:
            return candidate, extension(candidate)
        except Exception as exc:  # no compiler, no ninja, a toolchain without these instructions
            reason = build_failure(exc)
            fallback = "the next level down" if candidate != candidates[-1] else "torch's slower paths"
            log.warning("the CPU has %s but its kernels failed to build (%s); using %s", candidate, reason,
                        fallback)
    return None, None


def build_failure(exc: Exception) -> str:
    """Why a build failed, in a line: torch's message begins with ninja's status line (the whole compile
    command, a kilobyte naming no cause), so the first short line after it that says an error or a missing
    file ("c++: not found", "fatal error: ..."), else the start of the message."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    telling = [line for line in lines[1:] if len(line) <= 300 and re.search(r"error|not found|no such", line, re.I)]
    return telling[0] if telling else lines[0][:300] if lines else type(exc).__name__


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
def kernel_sources_digest() -> str:
    """A short digest of csrc/: forward costs measured with other kernel sources (another version of
    triforce) are not this build's, and the calibration keys them apart."""
    digest = hashlib.sha256()
    for path in sorted(CSRC.glob("*.[ch]*")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:10]


@functools.cache
def has_amx() -> bool:
    """The extension is here and may use AMX tiles (the tile paths of the attention and linear kernels)."""
    ext = cpu_kernels()
    return ext is not None and ext.amx_usable()
