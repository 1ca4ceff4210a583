"""How much memory a device has free: the coordinator's batch check (api.py) and a worker's check before
it allocates a sequence's cache (workers/checks.py) ask the same question. And memory that has been freed,
handed back to the system (release_freed)."""
from __future__ import annotations

import ctypes
import functools
import time
from pathlib import Path

import torch

CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_MEMBERSHIP = Path("/proc/self/cgroup")
DEFAULT_POOL = (0, 0)  # the id of torch's CUDA caching allocator's own pool (a graph's pool has another)
UNLIMITED = 2**60  # a cgroup v1 limit at or past this is none (v1 writes 2**63 rounded down to a page)


def size_text(n_bytes: float) -> str:
    """Bytes for a message: GiB with two decimals, or MiB or KiB where that would read 0.00 GiB."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if n_bytes >= scale / 100:
            return f"{n_bytes / scale:.2f} {unit}"
    return f"{n_bytes / 2**10:.2f} KiB"


def available_bytes(device: torch.device) -> int | None:
    """Free bytes on `device` (a GPU's free memory, with what torch's allocator holds unused in its default
    pool: `cached_unused_bytes`; on a CPU, the system's MemAvailable, or less where this process's cgroups
    leave less: a container's memory limit, which MemAvailable does not see, and past which the kernel kills
    the process); None if unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0] + cached_unused_bytes(device)
    system = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    system = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    limited = [b for b in (system, cgroup_headroom()) if b is not None]
    return min(limited) if limited else None


def cached_unused_bytes(device: torch.device) -> int:
    """Bytes torch's caching allocator has reserved on `device` and holds unused in its default pool, which
    any allocation may take. Not those of a CUDA graph's private pool (models/cuda_graphs.py: the memory its
    captured forwards' temporaries keep between replays), which only that graph's replays use: reserved
    less allocated, as this was, counted them free, so a batch sized by it could fail to allocate."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    # (a snapshot lists every block of every device; this runs once per request admitted)
    try:
        return sum(segment["total_size"] - segment["active_size"] for segment in torch.cuda.memory_snapshot()
                   if segment["device"] == index and tuple(segment["segment_pool_id"]) == DEFAULT_POOL)
    except KeyError:  # a torch whose snapshot names these otherwise: reserved less allocated (graphs' pools too)
        return torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(index)


def cgroup_headroom(root: Path | None = None, membership: Path | None = None) -> int | None:
    """Bytes this process's memory cgroups still let it take: the least, over its cgroup and the ones
    above it (v2, or v1's memory controller), of limit - usage + inactive file pages (page cache the
    kernel reclaims before it kills); None where no limit is set or none can be read."""
    root, membership = root or CGROUP_ROOT, membership or CGROUP_MEMBERSHIP
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        return None
    rooms = []
    for line in lines:
        _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "-", "")
        if controllers == "":
            base, files = root, ("memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):
            base, files = root / "memory", ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        else:
            continue
        folder = base / path.lstrip("/")
        for cgroup in [folder, *folder.parents]:  # (in a container's namespace its own cgroup is the root)
            room = _cgroup_room(cgroup, *files)
            if room is not None:
                rooms.append(room)
            if cgroup == base:
                break
    return min(rooms) if rooms else None


def _cgroup_room(folder: Path, limit_file: str, usage_file: str, inactive_key: str) -> int | None:
    try:
        limit = (folder / limit_file).read_text().strip()
        if limit == "max" or int(limit) >= UNLIMITED:
            return None
        usage = int((folder / usage_file).read_text())
        stat = dict(line.split() for line in (folder / "memory.stat").read_text().splitlines() if " " in line)
    except (OSError, ValueError):
        return None
    return max(0, int(limit) - usage + int(stat.get(inactive_key, 0)))


@functools.cache
def _libc():
    try:
        libc = ctypes.CDLL(None)  # this process's own symbols: glibc's where it runs on glibc
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None


RELEASE_EVERY_S = 1.0  # at most this often (a trim of a few GB of heaps takes milliseconds)
_released = [0.0]  # when memory was last handed back


def release_freed(every_s: float = RELEASE_EVERY_S) -> None:
    """Hands memory that has been freed back to the system (glibc's malloc_trim; elsewhere nothing), unless
    it did within `every_s`: glibc keeps freed blocks of its heaps for reuse, and a long-lived server whose
    threads allocate tensors of many sizes held more and more of them (docs/serving.md). Called as
    requests finish (the server's scheduler, also once it goes idle; LLM.generate)."""
    libc, now = _libc(), time.monotonic()
    if libc is not None and now - _released[0] >= every_s:
        libc.malloc_trim(0)
        _released[0] = now
