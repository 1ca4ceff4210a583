"""The control plane between the coordinator and the worker group: versioned msgpack messages.

A message is a list of ZeroMQ frames: one msgpack header, then zero or more raw tensor frames. The
header is a map {"v": PROTOCOL_VERSION, "kind": ..., "body": {...}, "tensors": [[dtype, shape], ...]};
each raw frame holds the bytes of one tensor, described by its entry in "tensors". Nothing is ever
unpickled: headers decode with msgpack (no extension types), tensors are rebuilt with torch.frombuffer
after their byte count is checked against the declared dtype and shape.

KV replies (BULK_REPLIES) carry no tensor frames: a 7B model's refresh is about a GiB in 64 tensors.
Their body lists the tensors under "bulk" (the same [dtype, shape] descriptions), and the tensors follow
over torch.distributed (bulk.py), so a message stays small and its frame count does not grow with layers.

Every body is checked against its schema (field names and types) on receipt; a message that fails any
check raises ProtocolError, which a worker answers with an error reply while it keeps serving.
"""
from __future__ import annotations

import math

import msgpack
import torch

PROTOCOL_VERSION = 6  # 2: KV replies over the bulk link instead of tensor frames; 3: many sequences;
# 4: a prefill says whether it ends the prompt (the group may restore prompt blocks it keeps); 5: save_query
# and restore_query; 6: a start names the token counts of its forwards
MAX_MESSAGE_BYTES = 256 * 2**20  # a generous bound; larger messages are refused unread
MAX_FRAMES = 64

_INT, _STR, _BOOL = (int,), (str,), (bool,)
_INTS, _INT_LISTS = ("ints",), ("int lists",)

# kind -> {field: expected type}; "ints" is a list of ints, "int lists" a list of them. `seq` names one of
# the sequences the group holds (the coordinator picks the numbers).
REQUESTS: dict[str, dict[str, object]] = {
    "handshake": {"model": _STR, "tp_size": _INT, "protocol": _INT},
    # A new sequence: a cache for `capacity` tokens; `forwards`, the token counts of the forwards over it that
    # a one-rank group may replay as CUDA graphs (hierarchy.graph_sizes: their buffers are counted)
    "start": {"seq": _INT, "capacity": _INT, "forwards": _INTS},
    "end": {"seq": _INT},  # the sequence is done: its cache is freed
    # `final`: these tokens end the prompt. The reply's `reused` counts tokens restored from the group's
    # prefix store instead of forwarded (worker.py).
    "prefill": {"seq": _INT, "tokens": _INTS, "start": _INT, "final": _BOOL},
    # One forward of several sequences together: for each, a speculation tree over positions starts[i]..,
    # nodes in topological order; parents[i][j] < j or -1 for a child of the committed prefix (a chain is
    # -1, 0, 1, ...). The reply's one tensor holds every sequence's logits, in order.
    "verify": {"seqs": _INTS, "tokens": _INT_LISTS, "parents": _INT_LISTS, "starts": _INTS},
    "commit": {"seq": _INT, "path": _INTS, "start": _INT},  # node indices of the accepted path, root first
    "refresh": {"seq": _INT, "budget": _INT, "chunk_size": _INT, "full_layers": _INT, "start": _INT},
    "kv": {"seq": _INT, "start": _INT, "stop": _INT},  # the committed KV of positions [start, stop)
    # The last query a refresh scores chunks with, kept before forwards that are rolled back whole (a cost
    # measurement's filler tokens) and put back after them (FullKVCache.query_state)
    "save_query": {"seq": _INT},
    "restore_query": {"seq": _INT},
    "stats": {},
    "shutdown": {},
}
REPLY = "reply"
BULK_REPLIES = frozenset({"refresh", "kv"})  # replies whose tensors travel over the bulk link
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "int64": torch.int64,
          "int32": torch.int32}
_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def tcp_endpoint(host: str, port: int) -> str:
    """ZeroMQ's TCP endpoint of `host` (a name, an IPv4 or IPv6 address) and `port`."""
    return f"tcp://[{host.strip('[]')}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def zmq_socket(kind: int, endpoint: str):
    """A ZeroMQ socket of `kind` for `endpoint` (tcp_endpoint's), closed at once (no linger), IPv6 on where
    the endpoint is an IPv6 address (ZeroMQ takes IPv4 alone unless told). Not for names: with IPv6 on,
    ZeroMQ dials a name's IPv6 address first (localhost's ::1 in most hosts files, a cluster's AAAA
    records), where the leader listens on IPv4 (127.0.0.1, 0.0.0.0)."""
    import zmq

    sock = zmq.Context.instance().socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if endpoint.startswith("tcp://["):
        sock.setsockopt(zmq.IPV6, 1)
    return sock


class ProtocolError(ValueError):
    """A message that is malformed, truncated, oversized, of another version or against its schema."""


def encode(kind: str, body: dict | None = None, tensors: list[torch.Tensor] = ()) -> list[bytes]:
    tensors = [t.detach().contiguous().cpu() for t in tensors]
    header = {"v": PROTOCOL_VERSION, "kind": kind, "body": body or {}, "tensors": describe(tensors)}
    frames = [msgpack.packb(header, use_bin_type=True)]
    # bfloat16 has no numpy twin: ship the raw bytes through an int16 view.
    frames += [(t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes() for t in tensors]
    return frames


def reply(body: dict | None = None, tensors: list[torch.Tensor] = ()) -> list[bytes]:
    return encode(REPLY, {"ok": True, **(body or {})}, tensors)


def error_reply(message: str, full: bool = False, too_large: bool = False, ended: bool = False) -> list[bytes]:
    """`full`: the refusal is for now only (the group's memory or sequence slots are taken); `too_large`: a
    sequence the group's memory cannot hold even alone; `ended`: the request failed as it ran, and the group
    ends (its ranks may be mid-collective: nothing more can run on it)."""
    return encode(REPLY, {"ok": False, "error": message, **({"full": True} if full else {}),
                          **({"too_large": True} if too_large else {}), **({"ended": True} if ended else {})})


def decode(frames: list[bytes], max_bytes: int = MAX_MESSAGE_BYTES) -> tuple[str, dict, list[torch.Tensor]]:
    """frames -> (kind, body, tensors), or ProtocolError."""
    if not frames or len(frames) > MAX_FRAMES:
        raise ProtocolError(f"a message has 1 to {MAX_FRAMES} frames, not {len(frames)}")
    size = sum(len(f) for f in frames)
    if size > max_bytes:
        raise ProtocolError(f"message of {size} bytes exceeds the limit of {max_bytes}")
    try:
        header = msgpack.unpackb(bytes(frames[0]), raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several types for garbage and truncation
        raise ProtocolError(f"unreadable header ({type(exc).__name__}: {exc})") from None
    if not isinstance(header, dict):
        raise ProtocolError("header is not a map")
    if header.get("v") != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {header.get('v')!r}; this side speaks {PROTOCOL_VERSION}")
    kind, body, specs = header.get("kind"), header.get("body"), header.get("tensors")
    if not isinstance(body, dict) or not isinstance(specs, list):
        raise ProtocolError("header lacks a body map or a tensor list")
    if kind == REPLY:
        if not isinstance(body.get("ok"), bool):
            raise ProtocolError("reply lacks 'ok'")
    elif isinstance(kind, str) and kind in REQUESTS:  # (a list is unhashable: a TypeError, not a refusal)
        _check_body(kind, body, REQUESTS[kind])
    else:
        raise ProtocolError(f"unknown message kind {kind!r}")
    if len(specs) != len(frames) - 1:
        raise ProtocolError(f"header declares {len(specs)} tensors, message carries {len(frames) - 1}")
    return kind, body, [_tensor(spec, frame) for spec, frame in zip(specs, frames[1:])]


def _check_body(kind: str, body: dict, schema: dict) -> None:
    missing, extra = set(schema) - set(body), set(body) - set(schema)
    if missing or extra:  # (names of any type: msgpack's map keys may be bytes beside str)
        raise ProtocolError(f"{kind}: missing fields {sorted(missing)}, unknown fields {sorted(map(repr, extra))}")
    for name, expected in schema.items():
        value = body[name]
        if expected == _INTS:
            ok = _ints(value)
        elif expected == _INT_LISTS:
            ok = isinstance(value, list) and all(_ints(x) for x in value)
        else:
            ok = isinstance(value, expected) and not (expected != _BOOL and isinstance(value, bool))
        if not ok:
            raise ProtocolError(f"{kind}: field {name!r} has the wrong type")


def _ints(value) -> bool:
    return isinstance(value, list) and all(type(x) is int for x in value)


def describe(tensors: list[torch.Tensor]) -> list[list]:
    """The [dtype, shape] description of each tensor, as headers and bulk replies carry them."""
    return [[_DTYPE_NAMES[t.dtype], list(t.shape)] for t in tensors]


def parse_description(spec) -> tuple[torch.dtype, list[int]]:
    """One [dtype, shape] description -> (dtype, shape), or ProtocolError."""
    if (not isinstance(spec, list) or len(spec) != 2 or not isinstance(spec[0], str) or spec[0] not in DTYPES
            or not isinstance(spec[1], list)
            or not all(type(d) is int and d >= 0 for d in spec[1])):
        raise ProtocolError(f"bad tensor description {spec!r}")
    return DTYPES[spec[0]], spec[1]


def _tensor(spec, frame: bytes) -> torch.Tensor:
    dtype, shape = parse_description(spec)
    expected = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if len(frame) != expected:
        raise ProtocolError(f"tensor frame of {len(frame)} bytes, {expected} declared")
    if expected == 0:
        return torch.empty(shape, dtype=dtype)
    raw = torch.frombuffer(bytearray(frame), dtype=torch.int16 if dtype == torch.bfloat16 else dtype)
    return raw.view(dtype).reshape(shape) if dtype == torch.bfloat16 else raw.reshape(shape)
