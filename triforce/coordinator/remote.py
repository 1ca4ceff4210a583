"""The coordinator's side of the distributed pipeline: the target verified by a remote worker group.

`RemoteVerifier` is the `Verifier` seam over ZeroMQ for one sequence of the group (the group holds many,
each under the number its channel gave it): prefill, verify (a chain, as a tree whose parents are -1, 0,
1, ...; the sequences of a batch waiting at the target are verified in one request and one forward,
`forward_many`), commit (the accepted path), end (`close`) and the retrieval cache's reads (`RemoteKVSource`:
refresh = the static choice made by the workers on their shards, kv = committed KV for the tail; the KV
itself comes over the bulk link, workers/bulk.py), and save_query / restore_query around a cost
measurement's filler forwards (`query_state`). Requests go through a `ControlChannel` (channel.py),
which bounds every wait: a worker that dies or stops answering fails the request with a WorkerError
instead of a hang. Random draws and accept decisions never leave the coordinator.
"""
from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from ..step import Step
from .channel import ControlChannel, WorkerError
from .tiers import charge_call
from .verifier import Verifier


class RemoteKVSource:
    """What the retrieval cache reads, fetched from the workers (static policy)."""

    def __init__(self, verifier: "RemoteVerifier", cfg, dtype: torch.dtype, device: torch.device):
        self.verifier, self.dtype, self.device = verifier, dtype, device
        self.num_layers, self.num_kv_heads, self.head_dim = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim
        self.capacity = verifier.capacity

    @property
    def length(self) -> int:
        return self.verifier.length

    def retrieve(self, budget: int, chunk_size: int, full_layers: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        _, tensors = self.verifier.channel.request(
            "refresh", {"seq": self.verifier.seq, "budget": budget, "chunk_size": chunk_size,
                        "full_layers": full_layers, "start": self.length})
        tensors = [t.to(self.device, self.dtype) for t in tensors]
        return list(zip(tensors[0::2], tensors[1::2]))

    def committed(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        _, (keys, values) = self.verifier.channel.request("kv", {"seq": self.verifier.seq, "start": start,
                                                                 "stop": stop})
        return keys.to(self.device, self.dtype), values.to(self.device, self.dtype)


class RemoteVerifier(Verifier):
    """The target tier of one sequence, run by the worker group behind `channel`. `model` is the
    coordinator's copy of the target (tier 2 runs it); only its config, dtype and device are used
    here. Prompts go to the workers in their block size (the handshake's), which their prefix store keeps."""

    def __init__(self, channel: ControlChannel, model, capacity: int, forwards: list[int]):
        self.name, self.model, self.cache, self.prefill_chunk = "target", model, None, channel.prefill_chunk
        # costs differ from a local target's, and by the workers' devices (groups of A100s and of H100s
        # sharing a TRIFORCE_CALIBRATION folder shared one entry, keyed by the coordinator's machine)
        self.placement = f"workers={channel.tp_size}" + (f"@{channel.machine}" if channel.machine else "")
        self.channel, self.capacity, self.seconds = channel, capacity, 0.0
        self._length = self._verify_start = 0
        self._chunk: tuple[Step, bool] | None = None  # the prompt chunk yielded last, and whether it ends the prompt
        self.seq = channel.new_sequence()
        channel.request("start", {"seq": self.seq, "capacity": capacity, "forwards": forwards})
        self.open = True

    @property
    def length(self) -> int:
        return self._length

    def prefill_steps(self, tokens: list[int], progress=None) -> Iterator[Step]:
        """A chunk per step, as Tier.prefill_steps: the batch runs it with the other sequences' target
        forwards (forward_many), so a long prompt waits for a decoding neighbour's check instead of
        stalling it; the workers prefill it in a request of its own (restoring the blocks their prefix
        store holds)."""
        for i in range(0, len(tokens), self.prefill_chunk):
            piece = tokens[i:i + self.prefill_chunk]
            self._chunk = Step.chain(piece, self._length, self.model.device), i + len(piece) == len(tokens)
            yield self._chunk[0]
            if progress is not None:
                progress.update(len(piece))
        self._chunk = None

    def _prefill(self, step: Step) -> None:
        body, _ = self.channel.request("prefill", {"seq": self.seq, "tokens": step.tokens.tolist(),
                                                   "start": step.start, "final": self._chunk[1]})
        self._length = body["length"]
        self.reused_tokens += body["reused"]

    @staticmethod
    def forward_many(tiers: list["RemoteVerifier"], steps: list[Step], logits_for: list[str]) -> list:
        """One verify request, and one forward of the group, for several sequences of one channel (of
        several groups: one request each); prompt chunks (prefill_steps') a prefill request each, first."""
        chunks = [tier._prefilling(step) for tier, step in zip(tiers, steps)]
        start = time.perf_counter()
        for tier, step, chunk in zip(tiers, steps, chunks):
            if chunk:
                tier._prefill(step)
        prefill_s = time.perf_counter() - start
        out = [None] * len(tiers)
        checks = [i for i, chunk in enumerate(chunks) if not chunk]
        if checks:
            verified = RemoteVerifier._verify_many([tiers[i] for i in checks], [steps[i] for i in checks],
                                                   [logits_for[i] for i in checks])
            for i, logits in zip(checks, verified):
                out[i] = logits
        # The chunks' requests are the step's, as a local call's rows are: charged to every tier alike.
        charge_call(tiers, steps, ["none" if chunk else want for chunk, want in zip(chunks, logits_for)], prefill_s)
        return out

    @property
    def scoring_chunk(self) -> int:
        """A prompt chunk whose logits, scored (Tier.scoring_steps), fit in half a message."""
        return max(1, min(self.prefill_chunk, self.channel.max_bytes // 2 // self._row_bytes))

    @property
    def _row_bytes(self) -> int:
        return 4 * self.model.output_vocab_size  # a row of float32 logits

    def _prefilling(self, step: Step) -> bool:
        """Whether `step` is the prompt chunk prefill_steps yielded last (and not sent yet)."""
        return self._chunk is not None and step is self._chunk[0]

    @staticmethod
    def _verify_many(tiers: list["RemoteVerifier"], steps: list[Step], logits_for: list[str]) -> list:
        channel = tiers[0].channel
        if any(t.channel is not channel for t in tiers):
            return [RemoteVerifier._verify_many([t], [s], [lf])[0] for t, s, lf in zip(tiers, steps, logits_for)]
        parts = RemoteVerifier._parts_that_fit(steps, channel.max_bytes // 2 // tiers[0]._row_bytes)
        if len(parts) > 1:  # the logits of a large batch's checks (or scored prompt chunks) pass a message
            return [out for a, b in parts
                    for out in RemoteVerifier._verify_many(tiers[a:b], steps[a:b], logits_for[a:b])]
        start = time.perf_counter()
        body, (logits,) = channel.request("verify", {
            "seqs": [t.seq for t in tiers], "tokens": [s.tokens.tolist() for s in steps],
            "parents": [s.parent_list() for s in steps], "starts": [s.start for s in steps]})
        elapsed = time.perf_counter() - start
        out = []
        for tier, part, length, want in zip(tiers, logits.split([s.n for s in steps]), body["lengths"], logits_for):
            tier._verify_start, tier._length = tier._length, length
            tier.seconds += elapsed
            out.append(None if want == "none" else part[-1:] if want == "last" else part)
        return out

    @staticmethod
    def _parts_that_fit(steps: list[Step], rows: int) -> list[tuple[int, int]]:
        """Consecutive (start, end) ranges of `steps` of at most `rows` tokens each (a longer step alone)."""
        parts, start, held = [], 0, 0
        for i, step in enumerate(steps):
            if i > start and held + step.n > rows:
                parts.append((start, i))
                start, held = i, 0
            held += step.n
        return parts + [(start, len(steps))]

    def close(self) -> None:
        """The request is done: the group frees the sequence's cache (not once the group is lost)."""
        if self.open and not self.channel.broken:
            self.channel.request("end", {"seq": self.seq})
        self.open = False

    def truncate(self, length: int) -> None:
        if length < self._length:
            self.keep_path(length, [])

    def keep_path(self, start: int, path: list[int]) -> None:
        if start < self._verify_start:
            raise WorkerError(f"cannot roll the target back to {start}: {self._verify_start} tokens are committed")
        body, _ = self.channel.request("commit", {"seq": self.seq, "path": path, "start": start})
        self._length = body["length"]

    def query_state(self) -> int:
        """The group keeps the sequence's query state (one saved at a time); the token names the sequence."""
        self.channel.request("save_query", {"seq": self.seq})
        return self.seq

    def restore_query_state(self, state: int) -> None:
        self.channel.request("restore_query", {"seq": state})

    def sync(self) -> None:
        """The workers' cache needs no sync: it is the source."""

    def kv_source(self) -> RemoteKVSource:
        m = self.model
        return RemoteKVSource(self, m.config, m.dtype, m.device)
