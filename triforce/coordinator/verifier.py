"""The Verifier seam: the target with its full KV cache, wherever it runs.

A verifier offers the tier interface (`prefill`, `forward` = verify a chain and return the target's
logits, `truncate` = keep the accepted path, `length`, `sync`) plus `kv_source()`, the full cache the
retrieval tier reads its chunks from. `LocalVerifier` runs in this process; the distributed issue adds
a remote one that speaks ZeroMQ to a tensor-parallel worker group. The engine never knows which.
"""
from __future__ import annotations

from ..cache.full import FullKVCache
from ..cache.retrieval import LocalKVSource
from ..models.llama import LlamaModel
from .tiers import Tier


class Verifier(Tier):
    def kv_source(self):
        """What the retrieval cache reads: a LocalKVSource, or a remote source with the same methods."""
        raise NotImplementedError


class LocalVerifier(Verifier):
    def __init__(self, model: LlamaModel, capacity: int, prefill_chunk: int = 512):
        cache = FullKVCache(model.config, capacity, model.rope, model.dtype, model.device)
        super().__init__("target", model, cache, prefill_chunk)

    def kv_source(self) -> LocalKVSource:
        return LocalKVSource(self.cache)
