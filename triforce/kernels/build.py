"""Compiling the CPU kernels (csrc/) of one instruction-set level into a torch extension, cached per
level and digest (`build_name`) in ~/.cache/torch_extensions, one process building a folder at a time
(`_building`); cpu.py picks the level and loads what this builds."""
from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
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

log = logging.getLogger(__name__)
STALE_LOCK_S = 600.0  # a kernel build's lock file older than this was left by a build that was killed
KILLED_BUILD_S = 60.0  # ...where no triforce process is building (_building): a build takes under a minute
CSRC = Path(__file__).parent / "csrc"
_PATH_LOCK = threading.Lock()  # _our_ninja_first
_VECTOR_SOURCES = ("linear_bf16.cpp", "linear_f32.cpp", "linear_i8.cpp", "attention_bf16.cpp", "attention_f32.cpp",
                   "fused_bf16.cpp", "decoder_bf16.cpp", "retrieval_bf16.cpp", "bindings.cpp")
# Every level's scalar a * b + c as written: GCC's default (-ffp-contract=fast) fused some of them into one
# FMA in one inlined copy of a function and not in another, and at the avx2 level a decode step's attention
# rows (their keys read in registers) then summed otherwise than a check's (read from a widened copy) at
# some real keys, and greedy speculative output parted from plain decoding (docs/avx2.md, *A step's rows
# and a check's*)
_AS_WRITTEN = ["-ffp-contract=off"]
_AVX512_FLAGS = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mfma", "-mavx2", *_AS_WRITTEN]
BUILDS = {  # level -> (sources, compiler flags)
    "avx2": (("linear_avx2.cpp", "linear_f32.cpp", "linear_i8.cpp", "attention_avx2.cpp", "attention_f32.cpp",
              "fused_bf16.cpp", "decoder_bf16.cpp", "retrieval_bf16.cpp", "bindings.cpp"),
             ["-mavx2", "-mfma", *_AS_WRITTEN, "-DTRIFORCE_WITH_AMX=0"]),
    "avx512": (_VECTOR_SOURCES, _AVX512_FLAGS + ["-DTRIFORCE_WITH_AMX=0"]),
    "amx": (_VECTOR_SOURCES + ("amx.cpp", "linear_amx.cpp", "attention_amx.cpp"),
            _AVX512_FLAGS + ["-mamx-tile", "-mamx-bf16", "-DTRIFORCE_WITH_AMX=1"]),
}


def build(level: str):
    """The extension of `level`, compiled here unless a build of these sources, flags and tools is cached."""
    from torch.utils import cpp_extension

    name = build_name(level)
    sources, flags = BUILDS[level]
    build_dir = Path(cpp_extension._get_build_directory(name, verbose=False))
    built = build_dir / f"{name}.so"  # (its name holds the digest of what built it: never stale)
    if not _compiler():  # (a build's name holds its compiler's: none made here could be found without one)
        raise NoCompiler(f"no C++ compiler ({os.environ.get('CXX', 'c++')} is not on PATH; set CXX)")
    try:
        with _building(build_dir):
            if not built.exists():
                print(f"triforce: compiling the CPU kernels for {level} (half a minute or so, once)", file=sys.stderr)
            with _our_ninja_first():
                return cpp_extension.load(name=name, sources=[str(CSRC / s) for s in sources],
                                          extra_cflags=["-O3", "-fopenmp", *flags], extra_ldflags=["-fopenmp"],
                                          verbose=False)
    except OSError:  # a cache built ahead and read-only (a shared TORCH_EXTENSIONS_DIR): torch's load wants a
        if not built.exists():  # lock file in it, and every run took torch's paths
            raise
        return _imported(name, built)


class NoCompiler(RuntimeError):
    """No level's kernels can build here: the loader tries no lower level."""


def _imported(name: str, path: Path):
    """The extension already built at `path` (its name holds the digest of what built it)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_name(level: str) -> str:
    """The extension's name, and its build folder's: the level and a digest of what makes the build
    (`_build_digest`). Named by the level alone, one folder served every version: ninja rebuilds on a
    changed source's time or command line, but not on a new torch in the same environment (its headers are
    system includes, left out of ninja's dependencies): the old library, built against the other torch,
    then failed to load (or worse, loaded) and every level fell back to torch's paths until the folder was
    deleted; two checkouts also rebuilt each other's kernels in turn (a minute each), of the same sources
    too: torch's build file names each source by its path, so ninja saw a changed command line and rebuilt
    every object, then the other checkout's next run did the same (a git worktree of the same commit)."""
    return f"triforce_cpu_{level}_{_build_digest(level)}"


def _build_digest(level: str) -> str:
    """The sources and where they are, the level's flags, torch's and Python's versions and the compiler,
    digested."""
    import torch

    return hashlib.sha256("\0".join([kernel_sources_digest(), str(CSRC.resolve()), str(BUILDS[level]),
                                      torch.__version__, sysconfig.get_config_var("EXT_SUFFIX") or "",
                                      _compiler()]).encode()).hexdigest()[:8]


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


def build_failure(exc: Exception) -> str:
    """Why a build failed, in a line: torch's message begins with ninja's status line (the whole compile
    command, a kilobyte naming no cause), so the first short line after it that says an error or a missing
    file ("c++: not found", "fatal error: ..."), else the start of the message."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    telling = [line for line in lines[1:] if len(line) <= 300 and re.search(r"error|not found|no such", line, re.I)]
    return telling[0] if telling else lines[0][:300] if lines else type(exc).__name__


@functools.cache
def kernel_sources_digest() -> str:
    """A short digest of csrc/: forward costs measured with other kernel sources (another version of
    triforce) are not this build's, and the calibration keys them apart."""
    digest = hashlib.sha256()
    for path in sorted(CSRC.glob("*.[ch]*")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:10]
