"""The request loop every rank of a worker group runs (worker.py holds what it executes).

The leader (rank 0) receives each request over its ZeroMQ REP socket, has the worker check it, and
broadcasts it to the group as msgpack bytes; every rank executes it and the leader replies. A request that
every rank refuses alike as it runs (a start whose cache some rank could not allocate: they agree first)
is answered as refused; any other failure as it runs ends the group.

While no request comes, the leader broadcasts a heartbeat every `heartbeat_s`: the other ranks wait for
the next request inside a collective, which fails after the group's timeout, so an idle group would
otherwise fall apart; and a rank that died is noticed even while the group is idle. The heartbeat must not
outlive the coordinator, though: the leader watches its connection (watch.py), and once no coordinator
has been connected for `coordinator_timeout_s` it broadcasts ORPHANED, and every rank raises
CoordinatorLost, so the whole group exits together instead of serving nobody forever.
"""
from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING

import msgpack
import torch
import torch.distributed as dist

from ..errors import UserError
from ..models.parallel import TensorParallel
from .bulk import BulkLink
from .protocol import (BULK_REPLIES, MAX_MESSAGE_BYTES, ProtocolError, decode, describe, error_reply, reply,
                       zmq_socket)
from .checks import NeverFits, NoRoom, RequestError
from .worker import CoordinatorLost, VerifierWorker

if TYPE_CHECKING:
    from .watch import CoordinatorWatch

log = logging.getLogger(__name__)

HEARTBEAT = "heartbeat"  # a group-internal request: never sent over ZeroMQ, never executed
ORPHANED = "orphaned"  # group-internal too: the leader's decision that the coordinator is gone
DEFAULT_COORDINATOR_TIMEOUT_S = 30.0
ENDED_REPLY_LINGER_MS = 2000  # how long a leader that fails a request waits for its error reply to leave


def _broadcast_bytes(payload: bytes | None, tp: TensorParallel) -> bytes:
    """The leader's request bytes to every rank of the group (as uint8 tensors: no pickling)."""
    if tp.size == 1:
        return payload
    src = dist.get_global_rank(tp.group, 0)
    size = torch.tensor([len(payload) if payload is not None else 0], dtype=torch.int64)
    dist.broadcast(size, src=src, group=tp.group)
    buf = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if tp.rank == 0 else \
        torch.empty(int(size), dtype=torch.uint8)
    dist.broadcast(buf, src=src, group=tp.group)
    return buf.numpy().tobytes()


def _leader_wait(sock, watch: CoordinatorWatch, beat_at: float):
    """The leader's next request (its frames), HEARTBEAT when the group is due one (at `beat_at`, on
    time.monotonic's clock), or ORPHANED."""
    import zmq

    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(watch.monitor, zmq.POLLIN)
    while True:
        watch.update()
        if watch.seconds_left() <= 0:
            return ORPHANED
        wait_s = min(beat_at - time.monotonic(), watch.seconds_left())
        if wait_s <= 0:
            return HEARTBEAT
        ready = dict(poller.poll(None if wait_s == math.inf else max(1, int(wait_s * 1000))))
        if sock in ready:
            return sock.recv_multipart(copy=True)


def _refuse(sock, worker: VerifierWorker, exc: Exception) -> None:
    """The leader's answer to a request it (or, having run it, every rank) refused: the group goes on."""
    worker.counts["errors"] += 1
    sock.send_multipart(error_reply(str(exc), full=isinstance(exc, NoRoom), too_large=isinstance(exc, NeverFits)))


def serve(worker: VerifierWorker, endpoint: str | None, link: BulkLink | None, max_bytes: int = MAX_MESSAGE_BYTES,
          heartbeat_s: float | None = None, coordinator_timeout_s: float = DEFAULT_COORDINATOR_TIMEOUT_S) -> None:
    """The request loop of every rank of the group; returns after a shutdown request, raises
    CoordinatorLost when the coordinator is gone. `endpoint` (the leader's ZeroMQ bind address) and
    `link` (to the coordinator) are the leader's, ignored elsewhere. `heartbeat_s`: well under the worker
    group's timeout (None: no heartbeat). `coordinator_timeout_s`: how long the leader waits without a
    connected coordinator (or for a crashed one's connection to go quiet, half of it) before the group
    gives up."""
    tp = worker.tp
    sock = watch = None
    heartbeat_s = heartbeat_s if tp.size > 1 else None  # a group of one has no collective to keep alive
    if tp.rank == 0:
        import zmq

        from .watch import CoordinatorWatch

        if endpoint is None or link is None:
            raise ValueError("the worker leader needs a ZeroMQ endpoint and the bulk link to the coordinator")

        sock = zmq_socket(zmq.REP, endpoint)
        sock.setsockopt(zmq.MAXMSGSIZE, max_bytes)
        watch = CoordinatorWatch(sock, coordinator_timeout_s)
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            watch.close()
            sock.close(0)
            raise UserError(f"cannot listen on {endpoint}: {exc} (another worker group there? pick another "
                            f"--control-port)") from None
        log.info("worker leader listening on %s", endpoint)
    # When the other ranks began to wait in the next broadcast: they are due a heartbeat within heartbeat_s
    # of it, however many requests the leader refused meanwhile (each answered alone; each restarted the
    # wait before, so refusals under heartbeat_s apart let the group's collective time out)
    waiting_since = time.monotonic()
    linger_ms = 0
    try:
        while True:
            payload = None
            beat_at = waiting_since + heartbeat_s if heartbeat_s else math.inf
            frames = _leader_wait(sock, watch, beat_at) if tp.rank == 0 else None
            if frames is ORPHANED:
                log.error("worker leader: no coordinator connected to %s for %g s; the worker group exits",
                          endpoint, watch.limit_s())
                payload = msgpack.packb({"kind": ORPHANED, "body": {}})
            elif frames is HEARTBEAT:
                worker.counts["heartbeats"] += 1
                payload = msgpack.packb({"kind": HEARTBEAT, "body": {}})
            elif tp.rank == 0:
                worker.counts["requests"] += 1
                try:
                    kind, body, _ = decode(frames, max_bytes)
                    worker.check(kind, body)
                except (ProtocolError, RequestError) as exc:
                    _refuse(sock, worker, exc)
                    continue
                except Exception as exc:  # a check's own slip: nothing is broadcast yet, so refuse, not end
                    log.exception("worker leader: a request failed its checks unexpectedly")
                    worker.counts["errors"] += 1
                    sock.send_multipart(error_reply(f"malformed request ({type(exc).__name__}: {exc})"))
                    continue
                payload = msgpack.packb({"kind": kind, "body": body})
            request = msgpack.unpackb(_broadcast_bytes(payload, tp), raw=False)
            waiting_since = time.monotonic()  # (a heartbeat's: the ranks wait again at once)
            kind, body = request["kind"], request["body"]
            if kind == HEARTBEAT:
                continue
            if kind == ORPHANED:
                raise CoordinatorLost(f"the coordinator went away without a shutdown (no connection for "
                                      f"{coordinator_timeout_s:g} s)")
            started = time.perf_counter()
            # Checked above, so a failure here is a bug or a lost rank: let it end the process, and torchrun
            # the group, rather than leave ranks waiting in different collectives; the leader tells the
            # coordinator why first (else it saw a request unanswered, and the traceback on another node).
            try:
                result, tensors = worker.execute(kind, body)
            except RequestError as exc:  # refused by every rank alike, once they agreed (a start whose cache
                waiting_since = time.monotonic()  # some rank could not allocate): the group goes on
                if tp.rank == 0:
                    _refuse(sock, worker, exc)
                continue
            except Exception as exc:
                if tp.rank == 0:
                    sock.send_multipart(error_reply(f"{kind!r} failed as it ran ({type(exc).__name__}: {exc}); the "
                                                    "worker group ends", ended=True))
                    linger_ms = ENDED_REPLY_LINGER_MS  # (closed at once, the socket dropped the reply queued)
                raise
            waiting_since = time.monotonic()  # the other ranks go on to the next broadcast
            if tp.rank == 0:
                result["seconds"] = time.perf_counter() - started
                if kind in BULK_REPLIES:  # the reply says what follows over the link, then the link carries it
                    sock.send_multipart(reply({**result, "bulk": describe(tensors)}))
                    link.send(tensors)
                else:
                    sock.send_multipart(reply(result, tensors))
            if kind == "shutdown":
                return
    finally:
        if watch is not None:
            watch.close()
        if sock is not None:
            sock.close(linger_ms)
