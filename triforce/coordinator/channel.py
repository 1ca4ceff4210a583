"""The coordinator's control channel to a remote worker group (remote.py runs the target over it).

`ControlChannel` is a REQ socket to the group's leader speaking the msgpack protocol (workers/protocol.py)
and the bulk link that brings KV replies (workers/bulk.py). Every request waits at most `timeout_s` for its
reply, and each of its bulk tensors at most as long again (the link's timeout applies to every transfer, so
a slow but live leader may take longer in all); a worker that dies or stops answering fails the request
with a WorkerError instead of a hang, and a group whose memory or slots are taken refuses a new sequence
with GroupFull. `model_identity` is what the handshake compares.
"""
from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import torch

from ..config import PREFILL_CHUNK
from ..errors import TooLarge, UserError
from ..workers.bulk import BulkLink, LinkError
from ..workers.protocol import (BULK_REPLIES, MAX_MESSAGE_BYTES, PROTOCOL_VERSION, ProtocolError, decode, encode,
                                parse_description, zmq_socket)

DEFAULT_TIMEOUT_S = 30.0
POLL_S = 0.1  # how often a request waiting on the group looks whether it was abandoned


class WorkerError(UserError):
    """The worker group failed a request, or did not answer in time."""


STARTUP_TIMEOUT_S = 300.0  # how long the handshake waits at least: the workers load the model first
# why a request may go unanswered, by its kind: the first one also when nothing listens where it was sent
SILENT = {None: "a worker died or hangs",
          "prefill": "a worker died or hangs, or a prompt chunk takes the group longer: raise --worker-timeout",
          "handshake": "nothing listens there (--control-host, --control-port), or the workers did not load the "
                       f"model in that time (it waits {STARTUP_TIMEOUT_S:g} s or --worker-timeout, whichever is longer)"}


class GroupFull(WorkerError):
    """The group refused a new sequence for now: its memory or sequence slots are taken by others, and it
    may fit once one of them ends (a request waits, or a batch runs in parts)."""


class GroupTooSmall(WorkerError, TooLarge):
    """The group refused a new sequence for good: its memory cannot hold the sequence's cache even alone
    (the request's own fault, a server's 413, as a request too large for this process's memory)."""


def refusal(kind: str, reply_body: dict) -> WorkerError:
    """The error of a request of `kind` the group refused (reply_body: its error reply)."""
    error = GroupFull if reply_body.get("full") else GroupTooSmall if reply_body.get("too_large") else WorkerError
    if reply_body.get("ended"):
        return WorkerError(f"the worker group failed {kind!r}: {reply_body.get('error')}")
    return error(f"worker group refused {kind!r}: {reply_body.get('error')}")


def model_identity(folder: Path, rope_scaling: str | None = None) -> str:
    """What the handshake compares: the folder's config, the sizes of its weight files, the RoPE scaling it
    runs with, and the torchrun run the process belongs to (TORCHELASTIC_RUN_ID and MASTER_PORT: the same
    in every process of one run; the run id is "none" for torchrun without --standalone or --rdzv-id, and
    two runs at once have two master ports; none of either outside torchrun). A second run on the same
    control port and model found the first one's group, took sequence numbers it held and shut it down
    at its end; now the handshake refuses it."""
    folder = Path(folder)
    h = hashlib.sha1((folder / "config.json").read_bytes())
    h.update(f"run:{os.environ.get('TORCHELASTIC_RUN_ID', '')}:{os.environ.get('MASTER_PORT', '')}".encode())
    if rope_scaling:
        h.update(f"rope_scaling:{rope_scaling}".encode())
    for f in sorted(folder.glob("*.safetensors")):
        h.update(f"{f.name}:{f.stat().st_size}".encode())
    return h.hexdigest()[:16]


class ControlChannel:
    """A REQ socket to the worker group's leader, and the bulk link that brings its KV replies; counts
    messages, bytes (ZeroMQ's; bulk_bytes apart) and time spent waiting. `link` may be None for a
    channel that never asks for KV. One request at a time: a server's scheduler thread sends them, and
    the main thread the last (shutdown)."""

    def __init__(self, endpoint: str, timeout_s: float = DEFAULT_TIMEOUT_S, link: BulkLink | None = None,
                 max_bytes: int = MAX_MESSAGE_BYTES):
        import zmq

        self.endpoint, self.timeout_s, self.link, self.max_bytes = endpoint, timeout_s, link, max_bytes
        self.sock = zmq_socket(zmq.REQ, endpoint)
        self.sock.connect(endpoint)
        self.messages = self.bytes = self.bulk_bytes = 0
        self.wait_s = 0.0
        self.broken = self.closed = self.abandoned = False
        self.tp_size = self.prefix_bytes = 0  # the group's ranks and each one's prefix store, once the handshake told
        self.dtype = None  # the group's weights' dtype, as the handshake tells
        self.machine = ""  # the group's devices (costs.machine_key), as the handshake tells
        self.prefill_chunk = PREFILL_CHUNK  # the workers' prompt block (their prefix store's unit), as the
        # handshake tells
        self._sequences = 0  # numbers handed to RemoteVerifiers so far
        self._lock = threading.Lock()

    def new_sequence(self) -> int:
        """A number no other sequence on this channel has had."""
        self._sequences += 1
        return self._sequences

    def request(self, kind: str, body: dict | None = None,
                timeout_s: float | None = None) -> tuple[dict, list[torch.Tensor]]:
        with self._lock:
            return self._request(kind, body, timeout_s)

    def _request(self, kind: str, body: dict | None, timeout_s: float | None) -> tuple[dict, list[torch.Tensor]]:
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        if self.closed:
            raise WorkerError("the channel to the worker group is closed (the coordinator is shutting down)")
        if self.broken:
            raise WorkerError("the worker group failed or stopped answering earlier (or a request to it was "
                              "interrupted); start a new session")
        if kind in BULK_REPLIES and self.link is None:
            raise WorkerError(f"{kind!r} needs the bulk link to the worker leader (a torch.distributed group)")
        frames = encode(kind, body)
        start = time.perf_counter()
        deadline = start + timeout_s
        try:
            self.sock.send_multipart(frames)
            while not self.sock.poll(int(1000 * min(POLL_S, max(0.0, deadline - time.perf_counter())))):
                if self.abandoned or time.perf_counter() >= deadline:
                    why = "the coordinator is shutting down" if self.abandoned else \
                        f"it did not answer within {timeout_s:g} s ({SILENT.get(kind, SILENT[None])})"
                    raise WorkerError(f"the worker group at {self.endpoint} failed {kind!r}: {why}")
            answer = self.sock.recv_multipart()
        except BaseException:  # (a Ctrl-C too) a REQ socket between its request and the reply takes no other
            self.broken = True
            raise
        self.messages += 2
        self.bytes += sum(len(f) for f in frames) + sum(len(f) for f in answer)
        try:
            kind_back, reply_body, tensors = decode(answer, self.max_bytes)
            if reply_body.get("ok") and kind in BULK_REPLIES:
                bulk = reply_body.pop("bulk", None)
                if not isinstance(bulk, list):
                    raise ProtocolError(f"a {kind!r} reply lacks its bulk description")
                descriptions = [parse_description(d) for d in bulk]
        except BaseException as exc:  # broken: the leader may be sending a bulk reply's tensors, and answers
            # nothing meanwhile; and whatever the request changed on the workers (a verify's or a commit's cache
            # length) the coordinator did not learn, so its later requests would be refused as out of step
            self.broken = True
            if isinstance(exc, ProtocolError):
                raise WorkerError(f"unreadable reply from the worker group: {exc}") from exc
            raise
        if not reply_body.get("ok"):
            if reply_body.get("ended"):
                self.broken = True
            raise refusal(kind, reply_body)
        if kind in BULK_REPLIES:
            try:
                tensors = self.link.receive(descriptions)
            except LinkError as exc:
                self.broken = True
                raise WorkerError(f"the worker group failed {kind!r}: {exc}") from None
            except BaseException:  # (this process out of memory for the tensors, a Ctrl-C) the leader is left
                self.broken = True  # sending the rest, and answers no request until its send times out
                raise
            self.bulk_bytes += sum(t.nbytes for t in tensors)
        self.wait_s += time.perf_counter() - start
        return reply_body, tensors

    def abandon(self) -> None:
        """Stops waiting for the group: the request in progress, if any, fails within POLL_S (from another
        thread; the server's shutdown, whose signal ended the group's ranks too)."""
        self.abandoned = True

    def handshake(self, model_id: str, tp_size: int, startup_timeout_s: float = STARTUP_TIMEOUT_S) -> dict:
        """The first request: waits for the workers to load their shards (up to startup_timeout_s)."""
        body, _ = self.request("handshake", {"model": model_id, "tp_size": tp_size, "protocol": PROTOCOL_VERSION},
                               timeout_s=max(startup_timeout_s, self.timeout_s))
        if body["model"] != model_id:
            raise WorkerError(f"the workers serve another model, or belong to another torchrun run on this "
                              f"control port ({body['model']}, expected {model_id})")
        if tp_size and body["tp_size"] != tp_size:
            raise WorkerError(f"the worker group has {body['tp_size']} ranks, expected {tp_size}")
        self.tp_size, self.prefix_bytes = body["tp_size"], body["prefix_bytes"]
        self.dtype = body.get("dtype")  # the target's on the group (a --dtype auto of its own devices)
        self.machine = body.get("machine", "")  # its ranks' devices, as the forward costs key them
        self.prefill_chunk = body["prefill_chunk"]
        return body

    def close(self) -> None:
        """Closes the socket once a request in flight on another thread (a server's scheduler) has its
        reply or timed out, so that no thread uses it closed; later requests fail with a WorkerError."""
        with self._lock:
            self.closed = True
            self.sock.close(0)
