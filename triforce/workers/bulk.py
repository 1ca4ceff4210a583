"""The bulk link: big tensors (the retrieval cache's KV) between the coordinator and the worker group's
leader, over a two-rank gloo process group in the torchrun world they share.

ZeroMQ carries the request and a reply that only describes the tensors (protocol.BULK_REPLIES); the
leader then sends them here, in that order, and the coordinator receives them into buffers sized from
the description. A refresh of a 7B model is about a GiB: too big for one message, and its frame count
would grow with the layers.

Gloo, not NCCL, so that no transfer can hang: each one is bounded by the group's timeout (set to the
worker timeout when the group is made, launch/distributed.py), and a peer that died has closed its
sockets, so a receive from it fails at once.
"""
from __future__ import annotations

import re

import torch
import torch.distributed as dist


class LinkError(RuntimeError):
    """A bulk transfer failed: the peer died, or did not send within the group's timeout."""


class BulkLink:
    def __init__(self, group, peer: int):
        """group: a gloo process group holding this rank and `peer` (a global rank)."""
        self.group, self.peer = group, peer

    def send(self, tensors: list[torch.Tensor]) -> None:
        """Blocks until the peer has taken every tensor (or raises after the group's timeout)."""
        for t in tensors:
            if t.numel():  # the receiver knows the shape too, and skips empty tensors the same way
                dist.send(t.detach().contiguous().cpu(), self.peer, group=self.group)

    def receive(self, descriptions: list[tuple[torch.dtype, list[int]]]) -> list[torch.Tensor]:
        """One CPU tensor per (dtype, shape), as the peer sends them."""
        out = []
        for dtype, shape in descriptions:
            t = torch.empty(shape, dtype=dtype)
            if t.numel():
                try:
                    dist.recv(t, self.peer, group=self.group)
                except RuntimeError as exc:  # gloo: "Timed out waiting ..." or "Connection closed by peer"
                    raise LinkError(f"bulk transfer from rank {self.peer} failed: {_first_line(exc)}") from None
            out.append(t)
        return out


def _first_line(exc: Exception) -> str:
    """Gloo's message without its source location ("[.../pair.cc:553] Connection closed by peer ...")."""
    return re.sub(r"^\[[^\]]*\]\s*", "", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
