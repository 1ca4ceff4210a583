"""Every request of a server on one continuous batch, in a background thread.

Requests wait in a FIFO queue of at most `max_queue`; between steps of the batch the first waiting one
joins it when its caches fit beside the running requests' (or when nothing else runs), so requests run
together and the weights are read once for all of them (coordinator/batch.py: a request's output does
not depend on its companions, except which seeded sample mode auto's batch plan draws, and a near-tie's
rounding past a CPU kernel's rows). A request that
could not fit even alone is refused at once (413). Each request reports through its `on_event(kind,
data)`, called from the scheduler's thread: ("text", (piece, entries, ids)) as its text is committed
(streaming requests; entries: the log-probabilities of the tokens since the last piece,
Request.new_logprobs; ids: those of the tokens its output keeps since the last piece, Request.new_token_ids,
which also count them), then ("done", RequestOutput) or
("error", ApiError): 400 where the request's own settings ended it (its rules contradict each other), 500
or 503 where the server failed it.
`cancel()` drops a waiting request, and ends a running one after its round in progress (a client that
went away); `drain()` does that to all of them when the server shuts down. Whether a request's caches fit
is serve/admission.py's.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..api import LLM
from ..errors import RequestFailed
from ..request import Request
from ..coordinator.channel import GroupFull
from ..coordinator.batch import SequenceBatch
from ..coordinator.batchmates import Batchmates
from .admission import MemoryAdmission
from .openai import ApiError, Job
from .tickets import Ticket, failure

log = logging.getLogger("triforce.serve")


@dataclass(eq=False)
class Scheduler:
    llm: LLM
    max_queue: int = 64
    waiting: deque = field(default_factory=deque)
    running: dict = field(default_factory=dict)  # batch sequence -> its ticket
    metrics: object = None  # a ServerMetrics (metrics.py), told of every request that ends
    on_fatal: Callable[[Exception], None] | None = None  # told once the worker group has stopped answering

    def __post_init__(self):
        self.fatal: Exception | None = None  # why the scheduler stopped for good (a worker group gone)
        self._memory = MemoryAdmission(self.llm)
        self._batch, self._mates = SequenceBatch(), Batchmates()
        self._lock, self._wake, self._stop, self._draining = threading.Lock(), threading.Event(), False, False
        self._aborting = False  # a drain's running requests end after their round in progress
        self._thread = threading.Thread(target=self._loop, name="triforce-scheduler", daemon=True)
        self._thread.start()

    def submit(self, job: Job, on_event: Callable[[str, object], None]) -> Ticket:
        """Queues a checked request of one choice: `submit_choices` with its one callback."""
        return self.submit_choices(job, [on_event])[0]

    def submit_choices(self, job: Job, on_events: list[Callable[[str, object], None]]) -> list[Ticket]:
        """Queues a checked request's choices (Job.choices), all or none, choice i telling on_events[i];
        raises ApiError 413 (they can never fit), 400 (more choices than the queue holds) or 503 (the
        queue is full, or the scheduler has stopped)."""
        if len(on_events) != len(job.prompts) * job.n:
            raise ValueError(f"{len(on_events)} callbacks for {len(job.prompts) * job.n} choices")
        self._check_running()
        self._memory.refuse_too_large(job)
        if len(on_events) > self.max_queue:
            raise ApiError(400, f"{len(on_events)} choices (prompts x n) need as many places in this server's "
                                f"queue, which holds {self.max_queue} (--max-queue)",
                           param="n" if job.n > 1 else "prompt")
        choices = job.choices()  # (after the queue's bound: 2,048 prompts x n 128 took seconds on the event loop)
        with self._lock:
            self._check_running()  # again: a group lost meanwhile emptied the queue, and would not tell these
            # requests whose clients went away wait for nothing (_admit skips them): dropped here, where they
            # piled up behind a request waiting for memory
            self._drop_cancelled()
            if len(self.waiting) + len(on_events) > self.max_queue:
                raise ApiError(503, f"the server's queue is full ({self.max_queue} requests waiting); retry later",
                               kind="server_error", code="queue_full")
            sizes = [(len(ids), params.max_tokens, params.prompt_logprobs is not None) for ids, params in choices]
            tickets = [Ticket(job, ids, self.llm.seeded(params), tell, self.llm.cache_bytes_for(*size),
                              self.llm.host_bytes_for(*size))
                       for (ids, params), tell, size in zip(choices, on_events, sizes)]
            self.waiting.extend(tickets)
        self._wake.set()
        return tickets

    def _drop_cancelled(self) -> None:
        """Waiting requests whose clients went away dropped from the queue, and counted (under the lock)."""
        kept = deque(t for t in self.waiting if not t.cancelled)
        for _ in range(len(self.waiting) - len(kept)):
            self._count("aborted")
        self.waiting = kept

    def _take_everyone(self) -> list[Ticket]:
        """Every request, the queue and the batch emptied; those waiting whose clients went away counted."""
        with self._lock:
            self._drop_cancelled()
            everyone = list(self.waiting) + list(self.running.values())
            self.waiting, self.running = deque(), {}
        return everyone

    def _check_running(self) -> None:
        """ApiError 503 where the scheduler has stopped or is draining: no request queued now would run."""
        if not self.alive:
            why = f": {self.fatal}" if self.fatal is not None else "; see its log"
            raise ApiError(503, f"the server's scheduler has stopped{why}", kind="server_error")
        if self._draining:
            raise ApiError(503, "the server is shutting down", kind="server_error")

    @property
    def queued(self) -> int:
        """Requests waiting to be admitted, those whose clients went away left out (/health, /metrics)."""
        with self._lock:
            return sum(not t.cancelled for t in self.waiting)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.fatal is None

    def drain(self, abandon_after_s: float | None = None, abort_after_s: float = 0.0) -> None:
        """The server is shutting down: waiting requests get an error and new ones are refused (503); running
        ones run on for `abort_after_s` (those that end meanwhile are answered whole, as vLLM lets them run
        out the shutdown's grace), then end after their round in progress (finish_reason "abort"), so their
        streams close properly before they are cut. With a worker group, a round still waiting on it
        `abandon_after_s` later fails instead (a signal that ended the server ended its ranks too), so its
        streams end with an error before they are cut."""
        workers = getattr(self.llm, "workers", None)
        if workers is not None and abandon_after_s is not None:
            timer = threading.Timer(abandon_after_s, workers.abandon)
            timer.daemon = True
            timer.start()
        with self._lock:
            self._draining = True
            self._drop_cancelled()
            waiting, self.waiting = list(self.waiting), deque()
        for ticket in waiting:
            ticket.cancel()
            self._count("failed")  # (/metrics missed them)
            ticket.tell("error", ApiError(503, "the server is shutting down", "server_error"))
        if abort_after_s > 0:
            timer = threading.Timer(abort_after_s, self._abort_running)
            timer.daemon = True
            timer.start()
        else:
            self._abort_running()
        self._wake.set()

    def _abort_running(self) -> None:
        with self._lock:
            self._aborting = True
            running = list(self.running.values())
        for ticket in running:
            ticket.cancel()
        self._wake.set()

    def stop(self) -> None:
        """Ends the scheduler's thread; requests still waiting or running (an app embedded without a drain,
        a test client leaving) are told the server stopped, where they waited forever."""
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=10)
        if not self._thread.is_alive() and self.fatal is None:
            left = self._take_everyone()
            for seq in list(self._batch.active):
                try:
                    seq.run.close()
                except Exception:  # noqa: BLE001
                    log.exception("could not close a request's run")
            self._end_failed(left, ApiError(503, "the server stopped", "server_error"))

    def _admit(self) -> None:
        """Moves waiting requests into the batch, first come first served, while their caches fit."""
        while True:
            if not self.running and self.waiting:  # (this thread alone adds to `running`; the trim out of the lock)
                self._memory.measure_idle()
            with self._lock:
                if not self.waiting:
                    return
                ticket = self.waiting[0]
                if self.running and not ticket.cancelled:
                    if not self._memory.fits_now(ticket, self.running.values()):
                        return  # it waits for a running request to end
                    if len(self.running) >= ticket.refused_beside:
                        return  # as does a request the worker group refused beside as many
                self.waiting.popleft()
            if ticket.cancelled:
                self._count("aborted")
                continue
            if not self.running and (too_large := self._memory.too_large_alone(ticket)) is not None:
                self._fail([ticket], too_large)
                continue
            job = ticket.job
            stream = None
            if job.stream:
                stream = lambda piece, t=ticket: t.tell(  # noqa: E731
                    "text", (piece, t.request.new_logprobs(), t.request.new_token_ids()))
            try:
                try:
                    ticket.request = Request(self.llm, ticket.ids, ticket.params, stream, self._mates)
                except GroupFull:
                    with self._lock:
                        if self.running and not self._draining:  # it waits, first in line, for one to end
                            ticket.refused_beside = len(self.running)
                            self.waiting.appendleft(ticket)
                            return
                    raise
                if ticket.cancelled:  # while its caches were allocated
                    ticket.request.cancel()
                # its wait up to its run, which times its prefill from here: the caches' allocation counted
                ticket.queued_s = time.perf_counter() - ticket.queued_at  # in neither (time to first token)
                seq = self._batch.add(ticket.request.run())
                with self._lock:
                    self.running[seq] = ticket
                    aborting = self._aborting  # a drain's abort may have run while it was in neither list
                if aborting:
                    ticket.cancel()
                if seq.done:
                    self._finish(seq)
            except Exception as exc:  # noqa: BLE001 (a request's failure must not stop the server)
                self._fail([ticket], exc)

    def _loop(self) -> None:
        try:
            while not self._stop and self.fatal is None:
                self._round()
        except Exception as exc:  # noqa: BLE001
            # The scheduler's own work failed outside any one request (free_memory on a device a sticky CUDA
            # error broke, say): with this thread gone, every request queued or running waited forever.
            log.exception("the scheduler stopped")
            self._stop_for_good(exc)

    def _round(self) -> None:
        """Admits what fits, then runs one step of the batch (or waits a while for work)."""
        self._admit()
        if not self._batch.active:
            self._memory.measure_idle(only_if_freed=True)
            self._wake.wait(0.1)
            self._wake.clear()
            return
        try:
            finished = self._batch.step()
        except Exception as exc:  # noqa: BLE001
            # A step runs every request's forward together: which one failed is not known, so all end.
            with self._lock:
                failed = list(self.running.items())
                self.running.clear()
            self._fail([ticket for _, ticket in failed], exc)  # told first: a close that raised lost them all
            for seq, _ in failed:
                try:
                    seq.run.close()  # its engine leaves the batchmates
                except Exception:  # noqa: BLE001 (the batch is made anew below all the same)
                    log.exception("could not close a request's run")
            self._batch = SequenceBatch()
            return
        for seq in finished:
            self._finish(seq)
        if finished:
            self._memory.released()

    def _stop_for_good(self, exc: Exception) -> None:
        """The worker group stopped answering (or the scheduler's own work failed): no request can run again.
        The others fail, /health says 503, and `on_fatal` ends the server, so that torchrun ends the group
        (a server that stayed up failed every request)."""
        self.fatal = exc
        ended = self._take_everyone()
        for seq in list(self._batch.active):  # their runs' prefix claims and batchmates go
            try:
                seq.run.close()
            except Exception:  # noqa: BLE001 (the others are told all the same, and on_fatal ends the server)
                log.exception("could not close a request's run")
        self._batch = SequenceBatch()  # (lost as a request was admitted: the round stepped the closed runs)
        self._end_failed(ended, exc)  # each counted and closed as a failed request is (its caches freed)
        if self.on_fatal is not None:
            self.on_fatal(exc)

    def _finish(self, seq) -> None:
        with self._lock:
            ticket = self.running.pop(seq, None)
        if ticket is None:  # ended already: a lost group failed it with the rest (_stop_for_good)
            return
        try:
            output = ticket.request.output(*seq.result)
        except Exception as exc:  # noqa: BLE001
            seq.error = None  # its traceback holds the run's frames, and so its caches, past the request
            self._fail([ticket], exc)
            return
        closing = ticket.close()
        self._count("finished", output.finish_reason, output.metrics, ticket.queued_s,  # before its client knows
                    ticket.params.prompt_logprobs is None)
        ticket.tell("done", output)  # its answer stands, whatever ending its sequence met
        if closing is not None and self._group_gone() and self.fatal is None:
            self._stop_for_good(closing)

    def _group_gone(self) -> bool:
        return getattr(getattr(self.llm, "workers", None), "broken", False)

    def _fail(self, tickets: list[Ticket], exc: Exception) -> None:
        group_gone = self._group_gone()
        log.error("request failed: %s: %s", type(exc).__name__, exc,
                  exc_info=None if group_gone or isinstance(exc, RequestFailed) else exc)
        self._end_failed(tickets, exc)
        if group_gone and self.fatal is None:
            self._stop_for_good(exc)

    def _end_failed(self, tickets: list[Ticket], exc: Exception) -> None:
        """Failed requests: each closed (its caches and sequence freed), counted and told why."""
        for ticket in tickets:
            ticket.close()
            self._count("failed")
            ticket.tell("error", failure(exc))
        self._memory.released(trim=False)  # their caches, back to the system before the capacity is read again

    def _count(self, event: str, *details) -> None:
        """Tells the metrics of a request that ended (`finished` or `failed`), where a server keeps them; a
        failure there is logged, and the request's client is told all the same."""
        if self.metrics is not None:
            try:
                getattr(self.metrics, event)(*details)
            except Exception:  # noqa: BLE001
                log.exception("could not count a %s request", event)
