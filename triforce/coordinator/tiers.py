"""A tier is a model reading one KV cache policy. The engine sees only this small interface:
`length`, `forward(step) -> logits`, `truncate(length)`, `keep_path(start, path)`, `sync()`,
`prefill(tokens)`; the engine builds every forward's `Step` (tokens, positions, mask).

The target tier sits behind the `Verifier` seam (verifier.py) and offers the same interface, so the
engine never knows whether the target runs in this process or across a tensor-parallel worker group.
"""
from __future__ import annotations

import time
from collections import deque

import torch

from ..cache.base import KVCache
from ..cache.retrieval import RetrievalKVCache
from ..models.llama import LlamaModel
from ..step import Step


def chunked_prefill(model: LlamaModel, cache: KVCache, tokens: list[int], chunk: int, progress=None) -> None:
    """Feeds `tokens` through `model` into `cache` in chunks (bounded attention memory)."""
    for start in range(0, len(tokens), chunk):
        step = Step.chain(tokens[start:start + chunk], cache.length, model.device)
        model(step, cache, logits_for="none")
        if progress is not None:
            progress.update(step.n)


class Tier:
    """A model + cache policy that computes its own KV (the draft tier; the local target)."""

    def __init__(self, name: str, model: LlamaModel, cache: KVCache, prefill_chunk: int = 512):
        self.name, self.model, self.cache, self.prefill_chunk = name, model, cache, prefill_chunk
        self.seconds = 0.0

    @property
    def length(self) -> int:
        return self.cache.length

    def prefill(self, tokens: list[int], progress=None) -> None:
        chunked_prefill(self.model, self.cache, tokens, self.prefill_chunk, progress)

    def forward(self, step: Step) -> torch.Tensor:
        """Appends the step's tokens (step.start must be `length`); returns their next-token logits [n, V]
        as float32 on the CPU."""
        if step.start != self.length:
            raise ValueError(f"{self.name}: a step from {step.start}, but the cache holds {self.length} tokens")
        start = time.perf_counter()
        logits = self.model(step, self.cache).cpu()
        self.seconds += time.perf_counter() - start
        return logits

    def truncate(self, length: int) -> None:
        self.cache.truncate(length)

    def keep_path(self, start: int, path: list[int]) -> None:
        """Keeps entries [0, start) and then start + path[i] (an accepted tree path), drops the rest."""
        self.cache.keep_path(start, path)

    def sync(self) -> None:
        self.cache.sync()

    def observe(self, proposed: int, accepted: int) -> None:
        """Told how many of this tier's proposals the tier above accepted (used by adaptive tiers)."""

    @property
    def rebuilds(self) -> int:
        """Retrieval cache rebuilds so far (0 for tiers without one)."""
        return 0


class RetrievalTier(Tier):
    """The target's weights over a RetrievalKVCache built from the target's full cache.

    Its prefill is a sync from that cache (no forward of its own). With the static policy it asks for a
    rebuild when the target's acceptance of its proposals over the last `window` drops below `threshold`:
    a sign that the chunks chosen no longer serve the current queries. (Not the draft's acceptance by
    this tier: a weak draft says nothing about the cache.)
    """

    def __init__(self, model: LlamaModel, cache: RetrievalKVCache, threshold: float, window: int):
        super().__init__("retrieval", model, cache)
        self.threshold, self.recent = threshold, deque(maxlen=window)
        self._rebuild_pending = False

    def prefill(self, tokens: list[int], progress=None) -> None:
        self.cache.sync()

    def observe(self, proposed: int, accepted: int) -> None:
        self.recent.extend([1] * accepted + [0] * (proposed - accepted))
        full = len(self.recent) == self.recent.maxlen
        if self.cache.policy == "static" and full and sum(self.recent) < self.threshold * len(self.recent):
            self._rebuild_pending = True

    @property
    def rebuilds(self) -> int:
        return self.cache.rebuilds

    def sync(self) -> None:
        self.cache.sync()
        if self._rebuild_pending:
            self.cache.rebuild()
            self.recent.clear()
            self._rebuild_pending = False
