"""Whether a request's caches fit in memory: the policy the server's scheduler (serve/scheduler.py) admits
requests by.

Its measure is what is free while no request runs (`measure_idle`, each time the server goes idle, after
what the last requests freed went back to the system), or more where memory was freed since; a request
that could not fit even alone is refused as it is queued (413), and again as it is about to run alone
(another process may have taken the memory since). Beside running requests a waiting one joins where its
caches fit beside their whole needs (a running request has not allocated all of its caches yet: its
retrieval buffers come once its prompt is prefilled; counted by what is free alone, a burst of long
prompts was let in past the memory, and their rebuilds failed every request in the batch) and in the
memory free now. A GPU's requests' rows of the vocabulary, in the host's memory, are counted alike.
"""
from __future__ import annotations

import time
from collections.abc import Collection

from ..errors import TooLarge
from ..memory import release_freed, size_text
from ..request_memory import HOST_SHARE
from .openai import ApiError, Job
from .tickets import Ticket

REFIT_S = 1.0  # how often a waiting request that did not fit is weighed again while the batch is unchanged


class MemoryAdmission:
    def __init__(self, llm):
        self.llm = llm
        self.capacity = llm.free_memory()  # bytes free for caches while no request runs (updated then)
        self.host_capacity = llm.host_free()  # and in the host's memory for a GPU's requests' rows
        self._freed = False  # whether requests' caches were freed since the server was last idle
        self._unfit: tuple[Ticket, int, float] | None = None  # the first waiting request that did not fit: beside
        # how many running requests, when

    def refuse_too_large(self, job: Job) -> None:
        """ApiError 413 where the longest of a job's prompts could never fit, even alone."""
        longest = max(len(ids) for ids in job.prompts)
        size = (longest, job.params.max_tokens, job.params.prompt_logprobs is not None)
        need, share = self.llm.cache_bytes_for(*size), self.llm.memory_share
        capacity = self.capacity  # what was free while none ran; the memory free now may only add to it, and
        if capacity is None or need > share * capacity:  # is read where that decides (on a GPU a snapshot of
            capacity = self._capacity_now(self.llm.free_memory())  # the allocator: on the event loop)
        if capacity is not None and need > share * capacity:
            raise ApiError(413, f"the caches for {longest + job.params.max_tokens} tokens need "
                                f"{size_text(need)}; this server has {size_text(share * capacity)} for "
                                f"them (--gpu-memory-utilization {share:g} of {size_text(capacity)})",
                           code="context_length_exceeded")
        rows, host = self.llm.host_bytes_for(*size), self.host_capacity  # (a scored prompt's rows too)
        if host is not None and rows > HOST_SHARE * host:
            raise ApiError(413, f"the rows of the vocabulary of {longest + job.params.max_tokens} tokens need "
                                f"{size_text(rows)} of the host's memory; it has {size_text(host)} free",
                           code="context_length_exceeded")

    def fits_now(self, ticket: Ticket, running: Collection[Ticket]) -> bool:
        """Whether `ticket`'s caches fit beside the `running` requests' now; weighed again only where the
        batch lost a request since it did not fit, or REFIT_S later (the memory others free): read before
        every step of the batch, the free memory (/proc, a GPU's allocator snapshot) cost a draft step's
        time, under the lock /health and /metrics wait for."""
        now = time.monotonic()
        if self._unfit is not None:
            unfit, beside, at = self._unfit
            if unfit is ticket and beside == len(running) and now - at < REFIT_S:
                return False
        fits = self._fits(ticket, running)
        self._unfit = None if fits else (ticket, len(running), now)
        return fits

    def too_large_alone(self, ticket: Ticket) -> TooLarge | None:
        """Why a request about to run alone cannot, where the memory measured just now (`measure_idle`) cannot
        hold it: its check as it was queued read what was free when the server last went idle, and another
        process may have taken it since (it ran, and failed out of memory)."""
        share, capacity = self.llm.memory_share, self.capacity
        if capacity is None or ticket.bytes <= share * capacity:
            return None
        return TooLarge(f"the caches for {len(ticket.ids) + ticket.params.max_tokens} tokens need "
                        f"{size_text(ticket.bytes)}; {size_text(share * capacity)} of the memory free "
                        f"now may hold them (--gpu-memory-utilization {share:g})")

    def released(self, trim: bool = True) -> None:
        """Requests ended and freed their caches: those go back to the system now (at most once a second;
        trim=False: a failed request's, at the next measure)."""
        if trim:
            release_freed()
        self._freed = True

    def measure_idle(self, only_if_freed: bool = False) -> None:
        """No request runs: what the last ones freed goes back to the system (once their answers are gone
        too), and what is free then is what requests' caches may share (only_if_freed: where requests ended
        since the last measure)."""
        if self._freed:
            release_freed(every_s=0)
            self._freed = False
        elif only_if_freed:
            return
        self.capacity, self.host_capacity = self.llm.free_memory(), self.llm.host_free()

    def _capacity_now(self, free: int | None) -> int | None:
        """Bytes the requests' caches may share (before --gpu-memory-utilization): those free while none ran,
        or more where memory was freed since; None where unknown."""
        if free is None or self.capacity is None:
            return free
        return max(self.capacity, free)

    def _fits(self, ticket: Ticket, running: Collection[Ticket]) -> bool:
        host = self.llm.host_free()
        if host is not None and self.host_capacity is not None:  # a GPU's requests' rows, in the host's memory
            held = sum(t.host_bytes for t in running)
            if ticket.host_bytes > min(HOST_SHARE * max(self.host_capacity, host) - held, HOST_SHARE * host):
                return False
        free = self.llm.free_memory()
        if free is None:
            return True
        reserved = sum(t.bytes for t in running)
        share = self.llm.memory_share
        return ticket.bytes <= min(share * self._capacity_now(free) - reserved, share * free)
