"""The kernels' build: every build input ships in the wheel, the instruction-set level is chosen as
documented (TRIFORCE_CPU_ISA), and a failed build says so once and falls back."""
import logging
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
import zipfile
from pathlib import Path

import pytest
import torch

from triforce.kernels import build, cpu
from triforce.models.loader import resolve_dtype

ROOT = Path(cpu.__file__).parents[2]


def test_wheel_ships_every_file_of_csrc(tmp_path):
    # Built from a copy: a build inside the checkout leaves build/ behind, whose stale files a later
    # build would ship.
    source = tmp_path / "source"
    shutil.copytree(ROOT / "triforce", source / "triforce", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(source)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("triforce-*.whl")
    shipped = {Path(name).name for name in zipfile.ZipFile(wheel).namelist()
               if name.startswith("triforce/kernels/csrc/")}
    on_disk = {p.name for p in build.CSRC.iterdir() if p.is_file()}
    assert shipped == on_disk
    assert {s for sources, _ in build.BUILDS.values() for s in sources} <= on_disk


@pytest.fixture
def fresh_level(monkeypatch):
    """Forget the cached level and extension before and after (the next caller loads the real one)."""
    cached = (cpu.isa_level, cpu.loaded_kernels, cpu.has_amx, cpu.extension)  # the real ones: tests patch them

    def clear():
        for fn in cached:
            fn.cache_clear()
        cpu._FAILED.clear()  # (and the builds that failed)

    clear()
    yield monkeypatch
    clear()


@pytest.mark.parametrize("wanted", ["avx2", "avx512", "amx"])
def test_isa_switch_takes_a_level_the_cpu_has_and_refuses_a_higher_one(fresh_level, wanted):
    fresh_level.setenv("TRIFORCE_CPU_ISA", wanted)
    best = cpu.cpu_isa()
    if best is not None and cpu.LEVELS.index(wanted) <= cpu.LEVELS.index(best):
        assert cpu.isa_level() == wanted
    else:
        with pytest.raises(cpu.IsaError, match="best level"):
            cpu.isa_level()


def test_isa_switch_refuses_an_unknown_level(fresh_level):
    fresh_level.setenv("TRIFORCE_CPU_ISA", "sse2")
    with pytest.raises(cpu.IsaError, match="avx2, avx512, amx"):
        cpu.isa_level()


def test_a_failed_build_warns_once_and_falls_back(fresh_level, caplog):
    fresh_level.setattr(cpu, "isa_level", lambda: "amx")
    tried = []

    def failing_build(level):
        tried.append(level)
        raise RuntimeError(f"Error building extension 'triforce_cpu_{level}'\nlong compiler output")

    fresh_level.setattr(cpu, "build", failing_build)
    with caplog.at_level(logging.WARNING, logger=cpu.__name__):
        assert cpu.loaded_kernels() == (None, None) and cpu.kernel_path() == "torch"
        cpu.loaded_kernels()
    assert tried == ["amx", "avx512", "avx2"]  # each level down, once
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3 and "long compiler output" not in "".join(messages)
    assert "the CPU has amx but its kernels failed to build" in messages[0] and "torch's slower paths" in messages[2]


def test_a_failed_builds_reason_is_the_line_that_says_it():
    """torch's message begins with ninja's status line, the whole compile command: the warning showed that
    kilobyte and dropped the line that says what went wrong."""
    command = "Error building extension 'triforce_cpu_avx2': [1/3] c++ -MMD -MF x.o.d " + "-I/include " * 200
    failed = RuntimeError(f"{command}\nFAILED: x.o\n/bin/sh: 1: c++: not found\nninja: build stopped")
    assert build.build_failure(failed) == "/bin/sh: 1: c++: not found"
    assert build.build_failure(RuntimeError("Error building extension 'x'\nlong compiler output")) == \
        "Error building extension 'x'"
    assert build.build_failure(RuntimeError("")) == "RuntimeError"


def test_kernels_off_switch(fresh_level):
    for off in ("0", "false", " Off ", "no"):  # ("false" left them on)
        fresh_level.setenv("TRIFORCE_CPU_KERNELS", off)
        cpu.loaded_kernels.cache_clear()
        assert cpu.kernel_path() == "torch" and cpu.cpu_kernels() is None
    fresh_level.setenv("TRIFORCE_CPU_KERNELS", "maybe")
    cpu.loaded_kernels.cache_clear()
    with pytest.raises(cpu.IsaError, match="TRIFORCE_CPU_KERNELS must be 1 or 0"):
        cpu.loaded_kernels()


def test_without_a_compiler_no_level_is_tried_and_one_line_says_so(fresh_level, caplog):
    """No level builds without a compiler: each was tried in turn (a ninja build and torch's compiler
    banner each), and the warning now says what the torch paths cost."""
    fresh_level.setattr(cpu, "isa_level", lambda: "amx")
    fresh_level.setattr(build, "_COMPILER", {})
    fresh_level.setenv("CXX", "no-such-compiler")
    with caplog.at_level(logging.WARNING, logger=cpu.__name__):
        assert cpu.loaded_kernels() == (None, None)
    (message,) = [r.getMessage() for r in caplog.records]
    assert "no C++ compiler (no-such-compiler is not on PATH; set CXX)" in message
    assert "torch's slower paths" in message and "near-tie" in message


def test_a_read_only_cache_built_ahead_is_imported(fresh_level, tmp_path):
    """A cache folder built ahead and read-only (a container's image, a shared folder): torch's load wanted
    its lock file there, failed, and every run took torch's paths."""
    import errno

    from torch.utils import cpp_extension

    if cpu.isa_level() is None or cpu.cpu_kernels() is None:
        pytest.skip("no kernels build on this machine")
    level = cpu.loaded_kernels()[0]
    name = build.build_name(level)
    folder = tmp_path / name
    folder.mkdir()
    shutil.copy(cpu.cpu_kernels().__file__, folder / f"{name}.so")

    def read_only(**kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(folder / "lock"))

    imported, real = [], build._imported
    fresh_level.setattr(build, "_imported", lambda name, path: imported.append(path) or real(name, path))
    fresh_level.setattr(cpp_extension, "_get_build_directory", lambda name, verbose: str(folder))
    fresh_level.setattr(cpp_extension, "load", read_only)
    assert hasattr(build.build(level), "linear_bf16") and imported == [folder / f"{name}.so"]
    (folder / f"{name}.so").unlink()
    with pytest.raises(OSError, match="Read-only"):  # nothing built ahead: the load's own error
        build.build(level)


@pytest.mark.parametrize("level,kernels,dtype", [("avx2", "avx2", "bfloat16"), ("avx2", "torch", "float32"),
                                                 ("avx512", "avx512", "bfloat16"), ("avx512", "torch", "bfloat16"),
                                                 ("amx", "amx", "bfloat16"), (None, "torch", "float32")])
def test_auto_dtype_is_bfloat16_only_where_it_is_fast(fresh_level, level, kernels, dtype):
    """bfloat16 where the CPU computes it natively, or where the AVX2 kernels widen it in registers."""
    fresh_level.setattr(cpu, "isa_level", lambda: level)
    fresh_level.setattr(cpu, "kernel_path", lambda: kernels)
    assert resolve_dtype("auto", "cpu") == dtype
    assert resolve_dtype("float16", "cpu") == "float16"


def test_auto_dtype_on_a_gpu_keeps_a_float16_checkpoint_float16(monkeypatch, tmp_path):
    """As vLLM's 'auto': a float16 checkpoint runs in float16 on a GPU with bfloat16 too (run in bfloat16 its
    greedy outputs parted from vLLM's and transformers' on the same folder); bfloat16 where the GPU has it
    otherwise, float16 where it does not. (Not run on a GPU here: torch's answers are faked.)"""
    import json

    import torch

    from triforce.models.loader import checkpoint_dtype

    monkeypatch.setattr(torch.version, "hip", None)
    for capability, checkpoint, dtype in (((8, 0), "float16", "float16"), ((8, 0), "bfloat16", "bfloat16"),
                                          ((9, 0), None, "bfloat16"), ((8, 0), "float32", "bfloat16"),
                                          ((7, 5), "bfloat16", "float16")):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device, c=capability: c)
        assert resolve_dtype("auto", "cuda", checkpoint) == dtype, (capability, checkpoint)
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "float16"}))
    assert checkpoint_dtype(tmp_path) == "float16" and checkpoint_dtype(tmp_path / "none") is None
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "bfloat16", "torch_dtype": "float16"}))
    assert checkpoint_dtype(tmp_path) == "bfloat16"  # transformers 5's name first


@pytest.mark.skipif(cpu.cpu_isa() not in ("avx512", "amx"), reason="torch runs at AVX2 or below here anyway")
def test_avx2_switch_takes_torch_down_to_avx2_too():
    env = {"TRIFORCE_CPU_ISA": "avx2", "PATH": "/usr/bin:/bin"}
    code = "import triforce, torch; print(torch.backends.cpu.get_cpu_capability())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "AVX2"


@pytest.mark.parametrize("path", ["/nonexistent", None])
def test_the_build_runs_the_ninja_our_install_brings(monkeypatch, tmp_path, path):
    """torch runs the first `ninja` on PATH. Ours (the `ninja` package, a dependency) is in the environment's
    bin folder, off PATH where the environment is not activated (`make run`): the build failed there on a
    machine without a system ninja, and alternating with a system one rebuilt the kernels each time. After
    the build PATH is as it was, unset included."""
    import ninja
    from torch.utils import cpp_extension

    seen = {}

    def load(**kwargs):
        seen["ninja"] = shutil.which("ninja")
        return "the extension"

    monkeypatch.setattr(cpp_extension, "load", load)
    monkeypatch.setattr(cpp_extension, "_get_build_directory", lambda name, verbose: str(tmp_path))
    if path is None:
        monkeypatch.delenv("PATH", raising=False)
    else:
        monkeypatch.setenv("PATH", path)
    assert build.build("avx2") == "the extension"
    assert seen["ninja"] and Path(seen["ninja"]).parent == Path(ninja.BIN_DIR)
    assert os.environ.get("PATH") == path


def test_a_ninja_that_lost_its_binary_adds_nothing_to_path(monkeypatch):
    """ninja's BIN_DIR is "" where it cannot find its binary (an install by --target or PYTHONPATH): put
    first on PATH, "" is the working directory, whose ./c++ or ./ninja the build would then run."""
    import ninja

    monkeypatch.setattr(ninja, "BIN_DIR", "")
    monkeypatch.setenv("PATH", "/usr/bin")
    with build._our_ninja_first():
        assert os.environ["PATH"] == "/usr/bin"


def test_the_kernels_build_where_the_cpu_and_a_compiler_can():
    """The kernel tests skip a level whose build fails (a machine without a compiler still passes): here,
    on an x86-64 CPU with AVX2 and a C++ compiler, a build that fails (a source that does not compile, no
    ninja found) fails instead of leaving every kernel test skipped, where TRIFORCE_REQUIRE_KERNELS=1 says
    the toolchain is whole (.ci/run); elsewhere (g++ without Python's headers, a gcc older than the
    instructions) the reason skips it, as the program falls back to torch's paths."""
    if cpu.cpu_isa() is None:
        pytest.skip("not an x86-64 CPU with AVX2 and FMA")
    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler on PATH")
    for level in cpu.available_levels():
        try:
            assert cpu.extension(level) is not None
        except Exception as exc:
            if os.environ.get("TRIFORCE_REQUIRE_KERNELS") == "1":
                raise
            pytest.skip(f"the {level} kernels did not build here ({build.build_failure(exc)}); "
                        f"TRIFORCE_REQUIRE_KERNELS=1 makes that a failure")


# Level-specific sources only: bindings.cpp (20 s of torch's headers each), the float32 kernels (AVX2 code
# on every level) and the fused layer loop (torch's ops and the kernels' declarations, no vector code of
# its own) compile the same in the avx2 build, which the kernel tests build for real.
_SAME_ON_EVERY_LEVEL = ("bindings.cpp", "linear_f32.cpp", "attention_f32.cpp", "decoder_bf16.cpp")


@pytest.mark.parametrize("level", [lv for lv in cpu.LEVELS if lv != "avx2"])
def test_the_levels_this_cpu_lacks_compile_too(level, tmp_path):
    """A CPU without AVX-512 (this project's AMD machines, and CI's) never builds the avx512 and amx
    kernels, so a source that no longer compiled there shipped unseen, and an AMX machine's run fell back
    to torch's paths with a warning. Compiling needs no such CPU: the level's own sources are compiled
    (not linked, never run) with its flags, at -O0, as one unit that includes them all (torch's headers
    parsed once: 8 s for the amx build's six sources, against 35 s one by one; an intrinsic used without
    its target flag still fails: always_inline)."""
    if platform.machine() not in ("x86_64", "AMD64") or shutil.which("c++") is None:
        pytest.skip("needs an x86-64 machine with a C++ compiler")
    if level in cpu.available_levels():
        pytest.skip(f"{level} is built for real here (test_the_kernels_build_where_the_cpu_and_a_compiler_can)")
    from torch.utils.cpp_extension import include_paths

    sources, flags = build.BUILDS[level]
    unit = tmp_path / f"{level}.cpp"
    unit.write_text("".join(f'#include "{build.CSRC / source}"\n' for source in sources
                            if source not in _SAME_ON_EVERY_LEVEL))
    includes = [f"-I{path}" for path in include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    done = subprocess.run(["c++", "-std=c++20", "-fPIC", "-O0", "-fopenmp", *flags, *includes, "-c", str(unit),
                           "-o", os.devnull], capture_output=True, text=True)
    if done.returncode and "unrecognized" in done.stderr and "-m" in done.stderr:
        pytest.skip(f"this compiler lacks the {level} flags: {done.stderr.strip().splitlines()[0]}")
    assert done.returncode == 0, f"{level}:\n{done.stderr[-3000:]}"


def test_the_build_is_named_by_what_makes_it(monkeypatch):
    """A new torch (or compiler, sources, flags) builds in a folder of its own: in the old one, ninja saw
    nothing changed (torch's headers are not among its dependencies) and the old library was loaded."""
    name = build.build_name("avx2")
    assert name.startswith("triforce_cpu_avx2_") and build.build_name("avx2") == name
    assert build.build_name("avx512") != name.replace("avx2", "avx512", 1)  # the flags count too
    if shutil.which("c++") and shutil.which("g++") and \
            os.path.realpath(shutil.which("c++")) == os.path.realpath(shutil.which("g++")):
        monkeypatch.setattr(build, "_COMPILER", {})
        monkeypatch.setenv("CXX", "g++")  # the same compiler by another name, in another locale
        monkeypatch.setenv("LANG", "de_DE.UTF-8")
        assert build.build_name("avx2") == name
    monkeypatch.setattr(torch, "__version__", "0.0.0-other")
    assert build.build_name("avx2") != name


def test_two_checkouts_of_the_same_sources_build_apart(monkeypatch, tmp_path):
    """Another checkout's csrc/, byte for byte the same: a folder of its own, as torch's build file names the
    sources by their paths (a shared folder rebuilt every object whenever the other checkout ran)."""
    name, sources = build.build_name("avx2"), build.kernel_sources_digest()
    shutil.copytree(build.CSRC, tmp_path / "csrc")
    monkeypatch.setattr(build, "CSRC", tmp_path / "csrc")
    assert build.kernel_sources_digest.__wrapped__() == sources  # the same sources (read afresh): only their place differs
    assert build.build_name("avx2") != name


def test_a_compiler_not_found_is_looked_for_again(monkeypatch):
    """A process that asked before a compiler was on PATH (a test's PATH) does not keep that answer."""
    path = os.environ.get("PATH", "")
    monkeypatch.setattr(build, "_COMPILER", {})
    monkeypatch.setenv("PATH", "/nonexistent")
    assert build._compiler() == ""
    monkeypatch.setenv("PATH", path)
    if shutil.which("c++"):
        assert build._compiler() != ""


def test_a_failed_build_is_not_tried_again(monkeypatch):
    """Without a toolchain every kernel test ran the failing build again (seconds each)."""
    calls = []

    def failing(level):
        calls.append(level)
        raise RuntimeError("c++: not found")

    monkeypatch.setattr(cpu, "build", failing)
    monkeypatch.setattr(cpu, "_FAILED", {})
    for _ in range(3):  # (a level no other test builds: the real levels' extensions stay loaded)
        with pytest.raises(RuntimeError, match="not found"):
            cpu.extension("no-such-level")
    assert calls == ["no-such-level"]


def test_a_lock_left_by_a_killed_build_is_removed_not_waited_on_forever(tmp_path, caplog):
    lock = tmp_path / "lock"
    lock.touch()
    os.utime(lock, (time.time() - 30, time.time() - 30))
    start = time.monotonic()
    build._clear_stale_lock(lock, stale_s=10, poll_s=0.01)
    assert not lock.exists() and time.monotonic() - start < 1 and "never finished" in caplog.text
    lock.touch()  # a fresh lock: another process is building; waited on until it goes
    threading.Timer(0.3, lock.unlink).start()
    build._clear_stale_lock(lock, stale_s=600, poll_s=0.01)
    assert not lock.exists()


def test_a_killed_builds_lock_goes_at_once_where_no_build_runs(tmp_path, caplog):
    """torch's lock file of a build killed midway (a Ctrl-C) held the next run for ten minutes: holding the
    lock beside the build folder, which the system frees with its process, this process knows no triforce
    build runs, and removes a file past KILLED_BUILD_S at once; a build that holds it is waited for."""
    build_dir = tmp_path / "triforce_cpu_avx2"
    build_dir.mkdir()
    (build_dir / "lock").touch()
    past = time.time() - build.KILLED_BUILD_S - 5  # the old way waited STALE_LOCK_S for it
    os.utime(build_dir / "lock", (past, past))
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger=build.__name__), build._building(build_dir):
        assert not (build_dir / "lock").exists()
    assert time.monotonic() - start < 5 and "never finished" in caplog.text
    import fcntl

    held = os.open(tmp_path / "triforce_cpu_avx2.building", os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)  # another process's build in progress
    (build_dir / "lock").touch()
    threading.Timer(0.3, lambda: (build_dir / "lock").unlink() or os.close(held)).start()
    with build._building(build_dir):  # entered once that build ended, its lock gone with it
        assert not (build_dir / "lock").exists()


def test_a_file_system_that_refuses_the_build_lock_builds_without_it(tmp_path, monkeypatch, caplog):
    """NFS or Lustre without flock (ENOLCK): the lock's error failed the build, and every level fell to
    torch's paths though the kernels were built."""
    import errno
    import fcntl

    def refused(fd, how):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", refused)
    build_dir = tmp_path / "triforce_cpu_avx2"
    build_dir.mkdir()
    with caplog.at_level(logging.WARNING, logger=build.__name__), build._building(build_dir):
        pass
    assert "going on without" in caplog.text


def test_forward_costs_are_kept_apart_by_the_kernel_sources(tmp_path, monkeypatch):
    """Costs calibrated with one version's kernels must not plan for another's: the machine key carries a
    digest of csrc/, which any change to a source changes."""
    from triforce.coordinator import costs

    shutil.copytree(build.CSRC, tmp_path / "csrc")
    source = (build.CSRC / "flash_decode.h").read_text()
    monkeypatch.setattr(build, "CSRC", tmp_path / "csrc")
    monkeypatch.setattr(cpu, "loaded_kernels", lambda: ("avx2", object()))
    digests = []
    try:
        for edit in ("", "// a comment\n"):
            (tmp_path / "csrc" / "flash_decode.h").write_text(source + edit)
            build.kernel_sources_digest.cache_clear()
            digests.append(build.kernel_sources_digest())
        costs.machine_key.cache_clear()
        key = costs.machine_key("cpu")
    finally:  # the real digest and key for the tests after this one
        build.kernel_sources_digest.cache_clear()
        costs.machine_key.cache_clear()
    assert digests[0] != digests[1] and f"|avx2@{digests[1]}|" in key


def test_the_machine_key_of_a_cpu_tier_is_the_cpus_on_a_machine_with_a_gpu(monkeypatch):
    """A draft on the CPU beside a target on the GPU (or any CPU tier of a GPU machine) runs the CPU
    kernels: costs and priors key it by the CPU, a GPU tier by the GPU (costs.py and priors.py pass each
    tier's device type; on an H100 machine every tier was keyed by the GPU)."""
    from triforce.coordinator import costs

    monkeypatch.setattr(torch.cuda, "get_device_name",
                        lambda device=None: "Other GPU" if device is not None and device.index == 1 else "Test GPU")
    costs.machine_key.cache_clear()
    try:
        on_cpu, on_gpu, on_second = costs.machine_key("cpu"), costs.machine_key("cuda"), costs.machine_key("cuda:1")
    finally:
        costs.machine_key.cache_clear()
    assert on_gpu.startswith("cuda:Test GPU|") and "GPU" not in on_cpu and "threads=" in on_cpu
    assert on_second.startswith("cuda:Other GPU|")  # each GPU by its own name (the current one named every one)
    # the cost table keys each tier by its own device
    from types import SimpleNamespace

    from triforce.models.config import ModelConfig

    cfg = ModelConfig(model_type="llama", vocab_size=8, hidden_size=16, intermediate_size=8, num_layers=2,
                      num_heads=2, num_kv_heads=1, head_dim=8, max_position_embeddings=64)
    keys = {}
    for device in ("cpu", "cuda"):
        model = SimpleNamespace(config=cfg, dtype=torch.bfloat16, device=torch.device(device))
        tier = SimpleNamespace(name="draft", model=model, placement="local", cache=None, length=100)
        keys[device] = costs.CostTable(None).entry_key(tier)
    costs.machine_key.cache_clear()
    assert keys["cpu"].startswith(on_cpu + "||") and keys["cuda"].startswith(on_gpu + "||")


def test_the_machine_key_holds_what_changes_the_costs(monkeypatch):
    """CUDA graphs turned off (small forwards then cost their kernels' launches), torch's and CUDA's versions,
    and on a CPU where torch's own paths run, the ISA cap TRIFORCE_CPU_ISA puts on them: each was missing
    from the key, and a calibration made otherwise was reused silently."""
    from triforce.coordinator import costs

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Test GPU")
    keys = {}
    try:
        for name, graphs, isa in (("base", "1", "avx512"), ("no graphs", "0", "avx512"), ("avx2", "1", "avx2")):
            monkeypatch.setenv("TRIFORCE_CUDA_GRAPHS", graphs)
            monkeypatch.setattr(cpu, "kernel_path", lambda: "torch")
            monkeypatch.setattr(cpu, "isa_level", lambda isa=isa: isa)
            costs.machine_key.cache_clear()
            keys[name] = (costs.machine_key("cuda"), costs.machine_key("cpu"))
    finally:
        costs.machine_key.cache_clear()
    assert keys["base"][0] == f"cuda:Test GPU|torch={torch.__version__}|cuda={torch.version.cuda}|graphs=on"
    assert keys["no graphs"][0].endswith("|graphs=off") and keys["no graphs"][1] == keys["base"][1]
    assert f"|torch:avx2:{torch.__version__}|" in keys["avx2"][1] and keys["avx2"][1] != keys["base"][1]


def test_an_amx_build_whose_tiles_the_os_refused_reports_the_path_that_runs(monkeypatch):
    """A CPU that has AMX whose OS refuses this process the tile state (a sandbox) runs the avx512 paths of
    the amx build; it reported "amx", and the calibration filed its costs with real AMX runs."""
    from types import SimpleNamespace

    for usable, path in ((False, "avx512"), (True, "amx")):
        monkeypatch.setattr(cpu, "loaded_kernels", lambda usable=usable: ("amx", SimpleNamespace(amx_usable=lambda: usable)))
        cpu.has_amx.cache_clear()
        assert cpu.kernel_path() == path
    cpu.has_amx.cache_clear()
