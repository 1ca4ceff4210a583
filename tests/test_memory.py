"""memory.available_bytes on a CPU: the system's MemAvailable, or a container's cgroup limit where that
leaves less (cgroup v2 and v1 trees written here); on a GPU, its free memory and what torch's allocator
holds unused outside CUDA graphs' pools."""
import pytest
import torch

import triforce.memory as memory
from triforce.memory import available_bytes, cached_unused_bytes, cgroup_headroom

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


def segment(device, pool, total, active):
    """A segment of torch.cuda.memory_snapshot(), with the fields available_bytes reads."""
    return dict(device=device, segment_pool_id=pool, total_size=total, active_size=active, allocated_size=active)


def test_on_a_gpu_a_cuda_graphs_pool_and_other_devices_are_not_free(monkeypatch):
    """Of the allocator's reserved bytes, those unused in its default pool on this device are free; a
    graph's pool's (only its replays use them) and another device's are not (the GPU path, with torch's
    snapshot and free memory written here: no GPU runs this)."""
    mib = 2**20
    snapshot = [segment(0, (0, 0), 20 * mib, 2 * mib), segment(0, (0, 0), 2 * mib, 2 * mib),
                segment(0, (1, 0), 64 * mib, 8 * mib), segment(1, (0, 0), 32 * mib, 0)]
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda: snapshot)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (100 * mib, 200 * mib))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert cached_unused_bytes(torch.device("cuda", 0)) == 18 * mib
    assert available_bytes(torch.device("cuda")) == 118 * mib
    assert available_bytes(torch.device("cuda", 1)) == 132 * mib


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_captured_graphs_temporaries_stay_out_of_the_free_bytes():
    device = torch.device("cuda")
    x = torch.ones(1 << 20, device=device)  # 4 MiB
    torch.cuda.synchronize()
    graph, pool = torch.cuda.CUDAGraph(), torch.cuda.graph_pool_handle()
    with torch.cuda.graph(graph, pool=pool):
        total = (x * 2 + 1).sum()  # two temporaries of 4 MiB, freed into the graph's pool
    graph.replay()
    assert total.item() == 3 * (1 << 20)
    unused = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    assert unused - cached_unused_bytes(device) >= 4 * 2**20
