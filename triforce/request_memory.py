"""Whether requests' caches fit in the memory free on the device (and, on a GPU, their rows of the vocabulary
in the host's), and the prefix store's bound. `RequestMemory` is a part of LLM (api.py), which holds the
`config`, `target`, `draft`, `device`, `workers`, `prefixes` and `memory_share` (vLLM's
gpu_memory_utilization) these read."""
from __future__ import annotations

import logging

import torch

from .config import PREFIX_CACHE_GB, ConfigError
from .coordinator.hierarchy import cache_bytes, row_bytes
from .errors import TooLarge
from .memory import available_bytes, size_text

log = logging.getLogger(__name__)

HOST_SHARE = 0.9  # of the host's free memory that a GPU's requests' rows of the vocabulary may take together


class RequestMemory:
    def _prefix_bound(self, prefix_cache_gb: float) -> int:
        """The prefix store's bound in bytes: at most half the memory free now (the rest is the running
        requests'); a bound asked past all of it is refused (every request then failed as too large)."""
        asked, free = int(prefix_cache_gb * 2**30), available_bytes(self.device)
        if free is None or asked <= free // 2:
            return asked
        if prefix_cache_gb != PREFIX_CACHE_GB and asked > free:
            raise ConfigError(f"prefix_cache_gb {prefix_cache_gb:g} is more than the {free / 2**30:.1f} GiB free on "
                              f"{self.device}, which requests' caches need too")
        if prefix_cache_gb != PREFIX_CACHE_GB:  # (the default's bound is its own business)
            log.warning("prefix store bounded to %.2f GiB, half the memory free on %s (%.2f GiB asked)",
                        free // 2 / 2**30, self.device, asked / 2**30)
        return free // 2

    def cache_bytes_for(self, prompt_len: int, max_tokens: int, scored: bool = False) -> int:
        """What one request needs in this process (hierarchy.cache_bytes: every tier's caches, speculation
        slack included, and its rows of the vocabulary; with a worker group, which holds the target's full
        cache, the tiers here). scored: its prompt is scored (prompt_logprobs), a row per token."""
        itemsize = self.target.dtype.itemsize
        draft = self.draft.config if self.draft is not None else None
        chunk = self.config.prefill_chunk if self.workers is None else self.workers.prefill_chunk
        return cache_bytes(self.config, self.target.config, draft, prompt_len + max_tokens, itemsize,
                           remote=self.workers is not None, scored_rows=min(prompt_len, chunk) if scored else 0,
                           rows_here=torch.device(self.device).type == "cpu",  # (a GPU's rows go to the host)
                           graphs=self.workers is None and self.target.forward_graphs is not None)

    def host_bytes_for(self, prompt_len: int, max_tokens: int, scored: bool = False) -> int:
        """What one request keeps in the host's memory where its caches are on a GPU: its float32 rows of the
        vocabulary (tiers.py moves a GPU's logits to the host; 86 MB for a Qwen2.5 1.5B request in mode
        triforce), which cache_bytes_for leaves out there. 0 on a CPU, where cache_bytes_for counts them."""
        if torch.device(self.device).type == "cpu":
            return 0
        draft = self.draft.config if self.draft is not None else None
        chunk = self.config.prefill_chunk if self.workers is None else self.workers.prefill_chunk
        return row_bytes(self.config, self.target.config, draft, min(prompt_len, chunk) if scored else 0)

    def host_free(self) -> int | None:
        """Bytes free in the host's memory for a GPU's requests' rows (host_bytes_for); None on a CPU, where
        they count in free_memory, or where unknown."""
        return None if torch.device(self.device).type == "cpu" else available_bytes(torch.device("cpu"))

    def _parts_that_fit(self, sizes: list[tuple[int, int] | tuple[int, int, bool]]) -> list[list[int]]:
        """The requests (prompt length, max tokens and whether the prompt is scored: cache_bytes_for's
        arguments) in order, grouped into batches that fit in the memory free on the device (one group when
        it is unknown). A worker group's leader checks the full caches it holds as each sequence starts; a
        refusal for now (GroupFull) splits a batch further."""
        free, host = self.free_memory(), self.host_free()
        room = None if free is None else self.memory_share * free
        host_room = None if host is None else HOST_SHARE * host
        parts: list[list[int]] = [[]]
        used = used_host = 0
        for i, size in enumerate(sizes):
            need = self.cache_bytes_for(*size) if room is not None else 0
            rows = self.host_bytes_for(*size)
            if room is not None and need > room:
                raise TooLarge(f"the caches for {size[0] + size[1]} tokens need {size_text(need)}; "
                               f"requests' caches may take {size_text(room)} (gpu_memory_utilization "
                               f"{self.memory_share:g} of the {size_text(free)} free on {self.device})")
            if host_room is not None and rows > host_room:
                raise TooLarge(f"the rows of the vocabulary of a request of {size[0] + size[1]} tokens need "
                               f"{size_text(rows)} of the host's memory, which has {size_text(host)} free")
            if parts[-1] and ((room is not None and used + need > room)
                              or (host_room is not None and used_host + rows > host_room)):
                parts.append([])
                used = used_host = 0
            parts[-1].append(i)
            used, used_host = used + need, used_host + rows
        return parts

    def free_memory(self) -> int | None:
        """Bytes free for this process's caches (None where unknown): with a worker group, for the tiers
        this process runs; the group's leader checks its own memory as a sequence starts, and a refusal for
        now, GroupFull, makes a batch run in parts or a served request wait."""
        free = available_bytes(self.device)
        if free is None or self.prefixes is None:
            return free
        return max(0, free - self.prefixes.room())  # what the prefix store may still grow into
