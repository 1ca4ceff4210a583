"""How much memory a device has free: the coordinator's batch check (api.py) and a worker's check before
it allocates a sequence's cache (workers/worker.py) ask the same question."""
from __future__ import annotations

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
