"""A server request's place in the scheduler (serve/scheduler.py), and what its client is told.

A `Ticket` is one choice of a checked request (Job.choices): its prompt ids and sampling settings, the
`on_event` through which its client hears of it, and once admitted its `Request`. `failure` is what a
client is told of the exception that ended its request.
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..coordinator.channel import WorkerError
from ..errors import RequestFailed, TooLarge
from ..request import Request
from ..sampling_params import SamplingParams
from .openai import ApiError, Job

log = logging.getLogger("triforce.serve")


@dataclass(eq=False)
class Ticket:
    job: Job
    ids: list[int]  # its choice's prompt and sampling settings (Job.choices)
    params: SamplingParams
    on_event: Callable[[str, object], None]
    bytes: int = 0  # what its caches take
    host_bytes: int = 0  # what its rows of the vocabulary take in the host's memory, its caches on a GPU
    request: Request | None = None
    cancelled: bool = False
    queued_at: float = field(default_factory=time.perf_counter)
    queued_s: float = 0.0  # how long it waited for the batch
    refused_beside: float = math.inf  # running requests beside which the worker group refused it (GroupFull)

    def cancel(self) -> None:
        self.cancelled = True
        if self.request is not None:
            self.request.cancel()

    def tell(self, kind: str, data) -> None:
        """Its client's `on_event(kind, data)`; what that raises is logged (the client's side is gone; the
        server goes on)."""
        try:
            self.on_event(kind, data)
        except Exception:  # noqa: BLE001
            log.exception("could not deliver a request's %s", kind)

    def close(self) -> Exception | None:
        """Ends its request (Request.close: its caches, its sequence on a worker group); what that raised (a
        worker group gone, say: it once ended the scheduler's thread, and every request in flight hung) is
        logged and returned."""
        try:
            if self.request is not None:
                self.request.close()
        except Exception as exc:  # noqa: BLE001
            log.warning("could not free a request's sequence: %s", exc)
            return exc
        return None


def failure(exc: Exception) -> ApiError:
    """What a client is told of the exception that failed its request (its __cause__): 400 (413: too large)
    where its own settings failed it as it ran, 503 where the worker group failed, 500 otherwise (a bug)."""
    if isinstance(exc, ApiError):  # (the server's own answer: a stop, say)
        return exc
    if isinstance(exc, RequestFailed):
        error = ApiError(413 if isinstance(exc, TooLarge) else 400, str(exc))
    else:
        status = 503 if isinstance(exc, WorkerError) else 500
        error = ApiError(status, f"generation failed: {type(exc).__name__}: {exc}", "server_error")
    error.__cause__ = exc  # (a batch job's traceback of a bug, and its end where a worker group is gone)
    return error
