"""memory.available_bytes on a CPU: the system's MemAvailable, or a container's cgroup limit where that
leaves less (cgroup v2 and v1 trees written here)."""
import torch

import triforce.memory as memory
from triforce.memory import available_bytes, cgroup_headroom

GIB = 2**30


def write(folder, **files):
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("_", ".", 1)).write_text(text)


def test_a_cgroup_v2_limit_counts_usage_and_reclaimable_page_cache(tmp_path):
    membership = tmp_path / "self-cgroup"
    membership.write_text("0::/job/step\n")
    write(tmp_path / "job", memory_max=str(8 * GIB), memory_current=str(7 * GIB), memory_stat="inactive_file 0\n")
    write(tmp_path / "job" / "step", memory_max=str(4 * GIB), memory_current=str(3 * GIB),
          memory_stat=f"anon 123\ninactive_file {GIB // 2}\n")
    # the step's own: 4 - 3 + 0.5 GiB; the job above it leaves 1 GiB: the least
    assert cgroup_headroom(tmp_path, membership) == GIB
    write(tmp_path / "job", memory_max="max")
    assert cgroup_headroom(tmp_path, membership) == GIB + GIB // 2
    write(tmp_path / "job" / "step", memory_max="max")
    assert cgroup_headroom(tmp_path, membership) is None  # no limit anywhere


def test_a_cgroup_v1_memory_controller_limit(tmp_path):
    membership = tmp_path / "self-cgroup"
    membership.write_text("5:cpu,cpuacct:/x\n4:memory:/docker/abc\n0::/\n")
    write(tmp_path / "memory" / "docker" / "abc", memory_limit_in_bytes=str(2 * GIB),
          memory_usage_in_bytes=str(GIB), memory_stat=f"inactive_file 5\ntotal_inactive_file {GIB // 4}\n")
    write(tmp_path / "memory", memory_limit_in_bytes="9223372036854771712", memory_usage_in_bytes="1")
    assert cgroup_headroom(tmp_path, membership) == GIB + GIB // 4


def test_available_bytes_is_the_least_of_the_system_and_the_cgroup(tmp_path, monkeypatch):
    system = available_bytes(torch.device("cpu"))
    assert system is not None and system > 0  # Linux: MemAvailable
    membership = tmp_path / "self-cgroup"
    membership.write_text("0::/\n")
    write(tmp_path, memory_max=str(3 * GIB), memory_current=str(2 * GIB), memory_stat="inactive_file 0\n")
    monkeypatch.setattr(memory, "CGROUP_ROOT", tmp_path)
    monkeypatch.setattr(memory, "CGROUP_MEMBERSHIP", membership)
    assert available_bytes(torch.device("cpu")) == min(system, GIB)
    write(tmp_path, memory_current=str(5 * GIB))  # past its limit: nothing free
    assert available_bytes(torch.device("cpu")) == 0
