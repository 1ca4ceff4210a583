"""The Verifier seam: the target with its full KV cache, wherever it runs.

A verifier offers the tier interface (`prefill`, `forward` = verify a chain and return the target's
logits, `truncate` = keep the accepted path, `length`, `sync`) plus `kv_source()`, the full cache the
retrieval tier reads its chunks from. `LocalVerifier` runs in this process; the distributed issue adds
a remote one that speaks ZeroMQ to a tensor-parallel worker group. The engine never knows which.
"""
from __future__ import annotations

from collections.abc import Iterator

from ..cache.full import FullKVCache
from ..cache.prefixes import PrefixStore
from ..cache.retrieval import LocalKVSource
from ..models.llama import LlamaModel
from ..step import Step
from .tiers import Tier


class Verifier(Tier):
    reused_tokens = 0  # prompt tokens restored from a prefix store instead of prefilled

    def kv_source(self):
        """What the retrieval cache reads: a LocalKVSource, or a remote source with the same methods."""
        raise NotImplementedError


class LocalVerifier(Verifier):
    def __init__(self, model: LlamaModel, capacity: int, prefill_chunk: int = 512, prefixes: PrefixStore | None = None):
        cache = FullKVCache(model.config, capacity, model.rope, model.dtype, model.device)
        super().__init__("target", model, cache, prefill_chunk)
        # blocks are reused only where they are this verifier's prefill chunks (a bench sweep may change them)
        self.prefixes = prefixes if prefixes is not None and prefixes.block == prefill_chunk else None

    def prefill_steps(self, tokens: list[int], progress=None) -> Iterator[Step]:
        """Tier.prefill_steps after restoring the stored blocks the prompt begins with; the prompt's blocks
        are stored once its prefill has run."""
        if self.prefixes is None or self.length:
            yield from super().prefill_steps(tokens, progress)
            return
        self.reused_tokens = self.prefixes.restore(tokens, self.cache)
        if progress is not None:
            progress.update(self.reused_tokens)
        yield from super().prefill_steps(tokens[self.reused_tokens:], progress)
        self.prefixes.store(tokens, self.cache)

    def kv_source(self) -> LocalKVSource:
        return LocalKVSource(self.cache)
