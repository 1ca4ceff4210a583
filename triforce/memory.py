"""How much memory a device has free: the coordinator's batch check (api.py) and a worker's check before
it allocates a sequence's cache (workers/worker.py) ask the same question. And memory that has been freed,
handed back to the system (release_freed)."""
from __future__ import annotations

import ctypes
import functools
import time

import torch


def available_bytes(device: torch.device) -> int | None:
    """Free bytes on `device` (a GPU's free memory, with what torch's allocator holds unused; on a CPU, the
    system's MemAvailable); None if unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device) - \
            torch.cuda.memory_allocated(device)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


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
